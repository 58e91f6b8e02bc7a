"""Real labs (root, network namespaces): shaped bandwidth, processes inside, and nothing left behind
after success, an exception, SIGINT, SIGTERM, a failed build, or a SIGKILLed owner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from geotrain.cli.main import main
from geotrain.cluster import cluster_from_dict
from geotrain.netlab import NetLab, run_script, sweep_stale_labs
from geotrain.netlab.linkcheck import measure_messages_s, measure_stream
from geotrain.netlab.names import NETNS_DIR
from geotrain.netlab.processes import pids_in_namespace
from proctree import cmdline, default_signals, descendants
from lab_marks import NEEDS_LAB
from paths import ROOT

pytestmark = [pytest.mark.serial, NEEDS_LAB]

SRC = str(ROOT / "src")
CLUSTER_DOC = {"name": "lab-2x2",
               "regions": [{"name": "east", "devices": 2, "intra": {"gbps": 1, "ms": 0.1}},
                           {"name": "west", "devices": 2, "intra": {"gbps": 1, "ms": 0.1}}],
               "links": [{"between": ["east", "west"], "gbps": 0.1, "ms": 20}]}
CLUSTER = cluster_from_dict(CLUSTER_DOC)
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def namespaces_of(prefix: str) -> list[str]:
    try:
        return sorted(name for name in os.listdir(NETNS_DIR) if name.startswith(prefix + "-"))
    except FileNotFoundError:
        return []


def process_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().split(") ")[1].startswith("Z"):
                    return True  # a zombie: dead, waiting for its (gone) parent's reaper
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_shaped_links_deliver_the_configured_bandwidth_per_destination():
    with NetLab(CLUSTER, [0, 2, 1]) as lab:  # rank 0, 2 in east, rank 1 in west
        cross = [measure_stream(lab, s, r, 6_250_000).bps for s, r in ((0, 1), (1, 0))]
        inside = measure_stream(lab, 0, 2, 6_250_000).bps
    for bps in cross:  # 6.25 MB at 100 Mbit/s: ~0.5 s; htb gets the wire rate, so goodput is the file's
        assert bps == pytest.approx(100e6, rel=0.05)
    assert inside > 3 * max(cross)  # the same interface, another destination: its own 1 Gbit/s class
    assert namespaces_of(lab.prefix) == []


def test_a_message_after_an_idle_spell_takes_its_links_time():
    # 98,304 B (one tiny-GPT micro-batch) over 5 Mbit/s: 157 ms at the link's rate. With 64 KiB htb
    # buckets and whole 64 KiB TCP packets such a message, sent after an idle spell, arrived in 5-60 ms.
    # A lower bound only: a loaded machine can only add time.
    slow = cluster_from_dict({"name": "slow", "regions": [{"name": "a", "devices": 1}, {"name": "b", "devices": 1}],
                              "links": [{"between": ["a", "b"], "gbps": 0.005, "ms": 0.5}]})
    with NetLab(slow, [0, 1]) as lab:
        seconds = measure_messages_s(lab, 0, 1, 98_304, count=3, idle_s=0.3)
    assert len(seconds) == 3
    assert min(seconds) >= 0.9 * 8 * 98_304 / 5e6


def test_processes_run_inside_their_namespace_and_are_stopped_at_exit():
    with NetLab(CLUSTER, [0, 2]) as lab:
        worker = lab.run(1, SLEEPER)
        assert worker.pid in pids_in_namespace(lab.devices[1].namespace)
        assert len(namespaces_of(lab.prefix)) == 3
        probe = lab.run(0, [sys.executable, "-c", "import socket; print(socket.if_nameindex())"],
                        stdout=subprocess.PIPE, text=True)
        names = probe.communicate(timeout=30)[0]
    assert "'gt0'" in names and "eth0" not in names  # only lo and its lab interface
    assert worker.poll() is not None
    assert namespaces_of(lab.prefix) == []


def test_an_exception_inside_the_lab_removes_everything():
    with pytest.raises(ZeroDivisionError):
        with NetLab(CLUSTER, [0, 1, 2]) as lab:
            worker = lab.run(2, SLEEPER)
            1 / 0
    assert namespaces_of(lab.prefix) == []
    assert worker.poll() is not None


def test_a_build_that_fails_half_way_removes_what_it_built():
    lab = NetLab(CLUSTER, [0, 1, 2])
    taken = lab.devices[1].namespace
    from pyroute2 import netns
    netns.create(taken)  # the lab's own name, already there: creating it fails mid-build
    try:
        with pytest.raises(OSError):
            lab.up()
        assert namespaces_of(lab.prefix) == [taken]
    finally:
        netns.remove(taken)


OWNER = textwrap.dedent("""
    import sys, time
    from geotrain.cluster import cluster_from_dict
    from geotrain.netlab import NetLab
    with NetLab(cluster_from_dict({doc!r}), [0, 2], sweep_stale=False) as lab:
        worker = lab.run(1, [sys.executable, "-c", "import time; time.sleep(600)"])
        print(lab.prefix, worker.pid, flush=True)
        time.sleep(600)
""")


def start_owner(tmp_path: Path) -> tuple[subprocess.Popen, str, int]:
    script = tmp_path / "owner.py"
    script.write_text(OWNER.format(doc=CLUSTER_DOC))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             preexec_fn=default_signals, env={**os.environ, "PYTHONPATH": SRC})
    line = owner.stdout.readline().split()
    assert len(line) == 2, "the owner did not build its lab"
    prefix, worker = line[0], int(line[1])
    assert len(namespaces_of(prefix)) == 3
    return owner, prefix, worker


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_ctrl_c_and_sigterm_tear_the_lab_down(tmp_path, sig, code):
    owner, prefix, worker = start_owner(tmp_path)
    owner.send_signal(sig)
    assert owner.wait(timeout=60) == code
    assert namespaces_of(prefix) == []
    assert process_gone(worker)


def kill_owner_and_guardians(owner: subprocess.Popen) -> None:
    """SIGKILL the owner's guardians (geotrain.procs.guardian), then the owner: nobody can clean up."""
    for pid in descendants(owner.pid):
        if "guardian.py" in cmdline(pid):
            os.kill(pid, signal.SIGKILL)
    owner.kill()
    owner.wait(timeout=30)


def test_a_sigkilled_owner_leaves_nothing_its_guardian_cleans_up(tmp_path):
    owner, prefix, worker = start_owner(tmp_path)
    owner.kill()
    owner.wait(timeout=30)
    assert process_gone(worker)  # PR_SET_PDEATHSIG: workers die with their owner
    deadline = time.monotonic() + 60
    while namespaces_of(prefix) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert namespaces_of(prefix) == []  # the guardian ran `netlab down --all`


def test_an_owner_killed_with_its_guardian_leaves_namespaces_that_down_all_removes(tmp_path, capsys):
    owner, prefix, worker = start_owner(tmp_path)
    kill_owner_and_guardians(owner)
    assert process_gone(worker)
    assert len(namespaces_of(prefix)) == 3  # nobody could clean up...
    assert main(["netlab", "list"]) == 0
    assert f"{prefix}" in (listed := capsys.readouterr().out) and "no (stale)" in listed
    assert main(["netlab", "down", "--all"]) == 0  # ...until this
    assert namespaces_of(prefix) == []
    assert f"{prefix}-lab" in capsys.readouterr().out


def test_the_next_lab_sweeps_the_leftovers_of_a_sigkilled_one(tmp_path):
    owner, prefix, _ = start_owner(tmp_path)
    kill_owner_and_guardians(owner)
    leftovers = namespaces_of(prefix)
    assert len(leftovers) == 3
    with NetLab(CLUSTER, [0, 1]) as lab:
        assert namespaces_of(prefix) == []
        assert set(leftovers) <= set(lab.swept)
    assert sweep_stale_labs() == []


def test_a_failing_rank_stops_the_others_after_the_grace_period():
    script = "import os, sys, time; sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(600)"
    with NetLab(CLUSTER, [0, 1, 2]) as lab:
        results = run_script(lab, [sys.executable, "-c", script], timeout_s=60, grace_s=0.5)
    assert [r.returncode for r in results] == [-signal.SIGTERM, 3, -signal.SIGTERM]


def test_a_lab_left_open_is_removed_at_interpreter_exit(tmp_path):
    script = tmp_path / "forgetful.py"
    script.write_text(textwrap.dedent(f"""
        from geotrain.cluster import cluster_from_dict
        from geotrain.netlab import NetLab
        lab = NetLab(cluster_from_dict({CLUSTER_DOC!r}), [0, 2], sweep_stale=False)
        lab.up()
        print(lab.prefix, flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": SRC})
    assert done.returncode == 0, done.stderr
    prefix = done.stdout.split()[0]
    assert prefix.startswith("gt") and namespaces_of(prefix) == []


def test_netlab_up_prints_the_lab_and_removes_it(capsys):
    assert main(["netlab", "up", "--cluster", "seed-geo", "--devices", "0,8", "--hold", "0"]) == 0
    out = capsys.readouterr().out
    assert "10.77.0.1" in out and "10.77.1.1" in out and "latency:" in out
    prefix = out.split("netlab ")[1].split()[0]
    assert namespaces_of(prefix) == []


def test_bench_netlab_measures_each_link_class(tmp_path, capsys):
    doc = {"name": "pair", "regions": [{"name": "a", "devices": 1}, {"name": "b", "devices": 1}],
           "links": [{"between": ["a", "b"], "gbps": 0.1, "ms": 5}]}
    path = tmp_path / "pair.json"
    path.write_text(json.dumps(doc))
    assert main(["bench", "netlab", "--cluster", str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    [row] = result["rows"]
    assert row["label"] == "a <-> b" and row["configured_gbps"] == pytest.approx(0.1)
    assert row["measured_gbps"] == pytest.approx(0.1, rel=0.10)
    assert row["configured_ms"] == pytest.approx(5)


GLOO_SCRIPT = textwrap.dedent("""
    import os, socket, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    addresses = [None] * dist.get_world_size()
    dist.all_gather_object(addresses, os.environ["GEOTRAIN_DEVICE"] + "@" + os.environ["GLOO_SOCKET_IFNAME"])
    if rank == 0:
        print("RESULT", value.item(), os.environ["MASTER_ADDR"], " ".join(addresses), flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_netlab_run_starts_one_gloo_rank_per_device_over_the_lab_links(tmp_path, capfd):
    script = tmp_path / "allreduce.py"
    script.write_text(GLOO_SCRIPT)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(str(CLUSTER_DOC).replace("'", '"'))
    before = set(os.listdir(NETNS_DIR)) if os.path.isdir(NETNS_DIR) else set()
    code = main(["netlab", "run", "--cluster", str(cluster), "--devices", "3,0,2", "--timeout", "120",
                 "--", str(script)])
    out = capfd.readouterr().out
    assert code == 0
    assert "RESULT 6.0 10.77.1.1 3@gt0 0@gt1 2@gt2" in out  # MASTER_ADDR: rank 0 = device 3, the lab's 1st in west
    assert set(os.listdir(NETNS_DIR)) <= before


def test_a_nic_limit_caps_one_stream_and_is_shared_by_concurrent_ones():
    from geotrain.netlab.linkcheck import BENCH_PORT, TCPBENCH

    one_region = cluster_from_dict({"name": "one", "regions": [{"name": "a", "devices": 3, "intra": {"gbps": 1, "ms": 0.1}}]})
    with NetLab(one_region, [0, 1, 2], nic_gbps=0.2) as lab:
        alone = measure_stream(lab, 0, 1, 12_500_000).bps
        receivers = [lab.run(r, [sys.executable, TCPBENCH, "recv", lab.devices[r].address, str(BENCH_PORT)],
                             stdout=subprocess.PIPE, text=True) for r in (1, 2)]
        assert [r.stdout.readline().strip() for r in receivers] == ["ready", "ready"]
        senders = [lab.run(0, [sys.executable, TCPBENCH, "send", lab.devices[r].address, str(BENCH_PORT), "12500000"])
                   for r in (1, 2)]
        assert [s.wait(timeout=60) for s in senders] == [0, 0]
        streams = [json.loads(r.communicate(timeout=60)[0].strip().splitlines()[-1]) for r in receivers]
    assert alone == pytest.approx(0.2e9, rel=0.10)  # the 1 Gbit/s link, capped by the 0.2 Gbit/s NIC
    # both streams together, over the window from the first one's first byte to the last one's last:
    # the NIC's rate, not twice it (however late the second sender started)
    window_s = max(s["started"] + s["seconds"] for s in streams) - min(s["started"] for s in streams)
    assert 8 * sum(s["bytes"] for s in streams) / window_s == pytest.approx(0.2e9, rel=0.10)
