"""The emulating backend in real processes: numbers in the report, exit codes, and clean stops."""

from paths import ROOT
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from geotrain.cli.main import main as cli_main
from geotrain.cluster import cluster_from_dict
from geotrain.emulate.launch import LaunchConfig, launch
from proctree import default_signals

FOUR = cluster_from_dict({"name": "t4", "regions": [
    {"name": "a", "devices": 2, "intra": {"gbps": 10, "ms": 1}},
    {"name": "b", "devices": 2, "intra": {"gbps": 10, "ms": 1}}],
    "links": [{"between": ["a", "b"], "gbps": 1, "ms": 50}]})
pytestmark = pytest.mark.slow  # real processes: seconds each
SRC = str(ROOT / "src")

COLLECTIVES = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((250_000,), float(rank + 1))          # 1e6 bytes
dist.all_reduce(t)
assert t[0].item() == world * (world + 1) / 2, t[0]
if rank == 0:
    dist.send(torch.zeros(250_000), 2)
    dist.send(torch.ones(250_000), 2)
if rank == 2:
    a, b = torch.empty(250_000), torch.empty(250_000)
    dist.recv(a, 0); dist.recv(b, 0)
    assert a.sum().item() == 0 and b.sum().item() == 250_000
out = [torch.empty(3) for _ in range(world)]
dist.all_to_all(out, [torch.full((3,), float(10 * rank + j)) for j in range(world)])
assert [o[0].item() for o in out] == [10.0 * j + rank for j in range(world)]
dist.monitored_barrier()
"""


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture(autouse=True)
def src_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_four_rank_report_has_the_hand_computed_allreduce_and_fifo_messages(tmp_path):
    script = write(tmp_path, "collectives.py", COLLECTIVES)
    report_path = tmp_path / "report.json"
    result = launch(FOUR, [0, 1, 2, 3], LaunchConfig((str(script),), time_scale=0.0, report_path=report_path,
                                                     timeout_s=120))
    assert result.exit_code == 0, result.rank_codes
    report = json.loads(report_path.read_text())
    allreduce = [o for o in report["ops"] if o["op"] == "allreduce"]
    assert len(allreduce) == 1 and allreduce[0]["nbytes"] == 1e6
    duration = allreduce[0]["end_s"] - allreduce[0]["start_s"]
    assert duration == pytest.approx(6 * (0.050 + 8 * 0.25e6 / 1e9), rel=1e-9)
    ring = [t for t in report["transfers"] if t["op"] == "allreduce"]
    assert len(ring) == 24 and {t["nbytes"] for t in ring} == {0.25e6}
    sends = [t for t in report["transfers"] if t["op"] == "send"]
    assert [(t["src_device"], t["dst_device"], t["nbytes"]) for t in sends] == [(0, 2, 1e6)] * 2
    first, second = sends
    assert first["end_s"] - first["start_s"] == pytest.approx(0.050 + 8e6 / 1e9)
    assert second["start_s"] >= first["end_s"] - 0.050 - 1e-9  # queued behind the first on the link
    barrier = [o for o in report["ops"] if o["op"] == "barrier"]
    assert barrier[0]["end_s"] - barrier[0]["start_s"] == pytest.approx(0.100)
    assert report["summary"]["inter_region_bytes"] > 0
    assert [r["device"] for r in report["ranks"]] == [0, 1, 2, 3]
    assert all(t["wire_end_s"] - t["start_s"] == pytest.approx(8e6 / 1e9) for t in sends)
    # the busiest 10 ms between regions: one 1 MB send (8 ms on the 1 Gbit/s link) fits, and nothing runs beside it
    # (the ring's rounds carry 0.5 MB in 2 ms, 52 ms apart, and end 50 ms before the allreduce returns)
    peaks = report["summary"]["peak_inter_region_gbps_by_window"]
    assert 0.8 - 1e-9 <= peaks["0.01"] <= 1.0 + 1e-9
    # traffic shorter than the window: its mean rate from the first message's start to the last one's end
    between = [t for t in report["transfers"] if (t["src_device"] < 2) != (t["dst_device"] < 2) and t["nbytes"]]
    span = max(t["wire_end_s"] for t in between) - min(t["start_s"] for t in between)
    assert peaks["1"] == pytest.approx(sum(t["nbytes"] for t in between) * 8 / 1e9 / span, rel=1e-4)


MESH = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
dist.init_process_group()
r, w = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
t = torch.tensor([float(r)])
dist.all_reduce(t, group=mesh.get_group("dp"))
assert t.item() == (1.0 if r < 2 else 5.0), t
peer = r ^ 1
a, b = torch.full((3,), float(r)), torch.empty(3)
for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, a, peer), dist.P2POp(dist.irecv, b, peer)]):
    work.wait()
assert b[0].item() == peer
x = torch.tensor([float(r + 1)])
dist.reduce(x, dst=0)
g = [torch.empty(1) for _ in range(w)] if r == 0 else None
dist.gather(torch.tensor([float(r)]), g, dst=0)
if r == 0:
    assert x.item() == 10 and [v.item() for v in g] == [0, 1, 2, 3]
s = torch.empty(1)
dist.scatter(s, [torch.tensor([float(i * 10)]) for i in range(w)] if r == 1 else None, src=1)
assert s.item() == 10 * r
objs = [None] * w
dist.all_gather_object(objs, {"r": r})
assert objs == [{"r": i} for i in range(w)]
out = torch.empty(w)
dist.all_gather_into_tensor(out, torch.tensor([float(r)]))
assert out.tolist() == [0, 1, 2, 3]
"""


def test_device_mesh_subgroups_batched_p2p_and_rooted_collectives_work(tmp_path):
    script = write(tmp_path, "mesh.py", MESH)
    path = tmp_path / "mesh.json"
    result = launch(FOUR, [0, 1, 2, 3], LaunchConfig((str(script),), 0.0, None, path, 120))
    assert result.exit_code == 0, result.rank_codes
    report = json.loads(path.read_text())
    dp_allreduce = [o for o in report["ops"] if o["op"] == "allreduce" and o["ranks"] in ([0, 1], [2, 3])]
    assert len(dp_allreduce) == 2  # one per dp sub-group, inside its region: 2 ring steps of 1 ms + 2 B
    for op in dp_allreduce:
        assert op["end_s"] - op["start_s"] == pytest.approx(2 * (0.001 + 8 * 2 / 10e9))


def test_nic_limit_slows_the_all_to_all(tmp_path):
    script = write(tmp_path, "a2a.py", """
        import torch, torch.distributed as dist
        dist.init_process_group()
        w = dist.get_world_size()
        out = torch.empty(w * 250_000)
        dist.all_to_all_single(out, torch.ones(w * 250_000))
    """)
    ends = {}
    for nic in (None, 1.0):
        path = tmp_path / f"r{nic}.json"
        result = launch(FOUR, [0, 1, 2, 3], LaunchConfig((str(script),), 0.0, nic, path, 120))
        assert result.exit_code == 0
        op = [o for o in json.loads(path.read_text())["ops"] if o["op"] == "all_to_all"][0]
        ends[nic] = op["end_s"] - op["start_s"]
    assert ends[None] == pytest.approx(0.050 + 8e6 / 1e9)
    assert ends[1.0] == pytest.approx(0.050 + 8 * 3e6 / 1e9)


def test_exit_code_is_the_worst_rank_and_the_others_are_stopped(tmp_path):
    script = write(tmp_path, "fail.py", """
        import sys, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            sys.exit(3)
        dist.barrier()      # the others would wait forever
    """)
    started = time.monotonic()
    result = launch(FOUR, [0, 1, 2, 3], LaunchConfig((str(script),), 0.0, grace_s=1.0, timeout_s=120))
    assert result.exit_code == 3  # the failing script's code, not the signal of the ranks stopped after it
    assert result.rank_codes[1] == 3 and all(code != 0 for code in result.rank_codes)
    assert time.monotonic() - started < 60


def test_timeout_kills_every_rank(tmp_path):
    script = write(tmp_path, "hang.py", """
        import os, sys, time
        open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").write(str(os.getpid()))
        time.sleep(600)
    """)
    # The ranks import torch before the script writes its pid: 8 s is ample on a quiet host; where a loaded
    # one kept a rank from getting that far, again with 25 s (every try must time out and kill every rank).
    for timeout_s in (8, 25):
        out = tmp_path / f"timeout-{timeout_s}"
        out.mkdir()
        result = launch(FOUR, [0, 1], LaunchConfig((str(script), str(out)), 0.0, timeout_s=timeout_s))
        assert result.exit_code == 124 and result.timed_out
        assert not any(Path(f"/proc/{pid}").exists() for pid in result.pids)
        if all((out / str(rank)).is_file() for rank in (0, 1)):
            break
    for rank in (0, 1):
        pid = int((out / str(rank)).read_text())
        assert pid in result.pids and not Path(f"/proc/{pid}").exists()


def _start_sleepers(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    script = write(tmp_path, "sleep.py", """
        import os, sys, time
        open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").write(str(os.getpid()))
        time.sleep(600)
    """)
    launcher = subprocess.Popen([sys.executable, "-m", "geotrain", "emulate", "--cluster", "seed-geo",
                                 "--devices", "0,9", "--", str(script), str(tmp_path)], preexec_fn=default_signals)
    deadline = time.monotonic() + 60
    while not all((tmp_path / r).exists() for r in "01") and time.monotonic() < deadline:
        time.sleep(0.1)
    return launcher, [int((tmp_path / r).read_text()) for r in "01"]


def _all_gone(pids: list[int], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(Path(f"/proc/{p}").exists() for p in pids)


def test_children_die_with_a_killed_launcher(tmp_path):
    launcher, pids = _start_sleepers(tmp_path)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    assert _all_gone(pids)


def test_ctrl_c_stops_every_rank_and_exits_130(tmp_path):
    launcher, pids = _start_sleepers(tmp_path)
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=30) == 130
    assert _all_gone(pids)


def test_cli_runs_a_module_with_plan_order_and_rejects_bad_devices(tmp_path, monkeypatch, capsys):
    write(tmp_path, "whoami_mod.py", """
        import json, os, sys, torch.distributed as dist
        dist.init_process_group()
        print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], sys.argv[1:], flush=True)
    """)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{SRC}")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"stages": 2, "replicas": 2, "assignment": [[3, 1], [0, 2]]}))
    report = tmp_path / "r.json"
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"name": "t4", "regions": [
        {"name": "a", "devices": 2, "intra": {"gbps": 10, "ms": 1}},
        {"name": "b", "devices": 2, "intra": {"gbps": 10, "ms": 1}}],
        "links": [{"between": ["a", "b"], "gbps": 1, "ms": 50}]}))
    code = cli_main(["emulate", "--cluster", str(cluster), "--plan", str(plan), "--time-scale", "0",
                     "--report", str(report), "-m", "whoami_mod", "--", "x"])
    assert code == 0
    assert json.loads(report.read_text())["devices"] == [3, 1, 0, 2]  # rank s*R + r = assignment[s][r]
    assert cli_main(["emulate", "--cluster", str(cluster), "--devices", "0,9", "--", "whatever.py"]) == 2
    assert "--devices[1]: device index must be in 0..3, got 9" in capsys.readouterr().err
