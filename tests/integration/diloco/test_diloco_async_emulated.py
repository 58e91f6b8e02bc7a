"""`DiLoCo(asynchronous=True)` under `geotrain emulate --emulate-gpu-speed`: the server serves requests in emulated-time
order (geotrain.sync.async_timing), so two A100 ranks send about as many outer gradients more than a T4 rank as their
emulated speed says (by wall seconds, on this one CPU, all three would send alike), the replies are timed by the
cluster's links, and every rank ends with the same model. `--compute-clock cpu`: the machine's load does not enter the
emulated speeds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paths import ROOT

MIXED = ROOT / "examples" / "clusters" / "mixed-gpus-3x2.yaml"  # devices 0, 1: A100 (oregon); 4: T4 (frankfurt)
H, TARGET = 4, 24

_SCRIPT = """
import json, sys
import torch
import torch.distributed as dist
from geotrain.diloco import DiLoCo
from geotrain.emulate import emulated_clock

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 256))
inner = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.Generator().manual_seed(rank)
clock = emulated_clock()
with DiLoCo(model, inner, sync_every=PERIOD_H, asynchronous=True, outer_lr=1.0, outer_momentum=0.0,
            regions=REGIONS) as diloco:
    while diloco.outer_step < TARGET:
        x = torch.randn(256, 256, generator=data)
        inner.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.flip(1)).backward()
        inner.step()
stats = diloco.asynchronous.stats()
state = diloco.asynchronous.emulation
sent = [t for t in state.transfers if t.op == "async"]
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as handle:
    json.dump({"pushes": stats["pushes"], "served_s": stats["served_s"], "clock_s": clock(),
               "params": float(sum(p.double().sum() for p in model.parameters())),
               "numel": sum(p.numel() for p in model.parameters()),
               "sent": [[t.dst_rank, t.nbytes, t.start_s, t.end_s] for t in sent]}, handle)
dist.destroy_process_group()
"""


def _run(tmp_path, regions) -> list[dict]:
    script = tmp_path / "async_loop.py"
    script.write_text(_SCRIPT.replace("PERIOD_H", str(H)).replace("TARGET", str(TARGET)).replace("REGIONS", regions))
    subprocess.run([sys.executable, "-m", "geotrain", "emulate", "--cluster", str(MIXED), "--devices", "0,1,4",
                    "--time-scale", "0", "--emulate-gpu-speed", "--compute-clock", "cpu", "--timeout", "250", "--",
                    str(script), str(tmp_path)], check=True, timeout=280, cwd=ROOT)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_async_replicas_send_as_often_as_their_emulated_gpu_speed_says(tmp_path):
    ranks = _run(tmp_path, "None")
    assert len({r["params"] for r in ranks}) == 1  # one final global model
    served = ranks[0]["served_s"][0]  # the server thread in rank 0's process
    assert len(served) == sum(r["pushes"] for r in ranks) + 3  # every update and each rank's final request
    assert served == sorted(served)  # served in emulated-time order, not as the requests reached it in wall time
    a100_pushes, t4_pushes = ranks[0]["pushes"] + ranks[1]["pushes"], ranks[2]["pushes"]
    # emulated, an A100 period takes 1/4.8 of a T4's and the T4's round trip to oregon 2 x 80 ms more: each A100
    # rank sends several times as often; served in wall order, the three would send alike
    assert t4_pushes >= 1 and a100_pushes >= 2 * 3 * t4_pushes, (a100_pushes, t4_pushes)
    # the T4's requests cross 80 ms and 0.5 Gbit/s to rank 0: each arrives at least that long after it left
    model_bytes = 4 * ranks[0]["numel"]
    t4_requests = ranks[2]["sent"]
    assert len(t4_requests) == t4_pushes + 1 and all(dst == 0 for dst, *_ in t4_requests)
    for _dst, nbytes, start, end in t4_requests:
        if nbytes > model_bytes:  # an outer gradient (the final request may carry none)
            assert end - start == pytest.approx(0.080 + 8 * nbytes / 0.5e9, rel=1e-6)
    # rank 0 (the server's process) sent the replies to the remote ranks: one per request, a whole model each
    replies = ranks[0]["sent"]
    assert len(replies) == sum(r["pushes"] for r in ranks[1:]) + 2
    assert all(nbytes > model_bytes for _dst, nbytes, *_ in replies)
    # every rank's clock ends at the final reply's arrival: within one crossing of the slowest link of each other
    clocks = [r["clock_s"] for r in ranks]
    assert max(clocks) - min(clocks) < 0.080 + 8 * 2 * model_bytes / 0.5e9


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_async_hierarchical_serves_each_level_in_emulated_order(tmp_path):
    ranks = _run(tmp_path, "[[0, 1], [2]]")  # the A100s' region server in rank 0's process, the T4 its own
    assert len({r["params"] for r in ranks}) == 1
    region, top = ranks[0]["served_s"]  # rank 0's threads: its region's server, then the global one
    assert region == sorted(region) and top == sorted(top) and ranks[2]["served_s"][0] == sorted(ranks[2]["served_s"][0])
    assert len(region) == ranks[0]["pushes"] + ranks[1]["pushes"] + 2
    a100_pushes, t4_pushes = ranks[0]["pushes"] + ranks[1]["pushes"], ranks[2]["pushes"]
    assert t4_pushes >= 1 and a100_pushes >= 2 * 3 * t4_pushes, (a100_pushes, t4_pushes)
    # the T4's replica talks to its own region's server in its process: only that server's merges cross to oregon
    merges = ranks[2]["sent"]
    assert merges and all(dst == 0 for dst, *_ in merges) and len(merges) <= t4_pushes + 1


_COLLECTIVE_LOOP = """
import sys
import torch
import torch.distributed as dist
from geotrain.diloco import DiLoCo
from geotrain.sync import async_timing

async_timing.STALL_S = 2.0
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(64, 1)
inner = torch.optim.SGD(model.parameters(), lr=0.01)
with DiLoCo(model, inner, sync_every=2, asynchronous=True) as diloco:
    while diloco.outer_step < 20:
        loss = model(torch.randn(32, 64)).pow(2).mean()
        inner.zero_grad()
        loss.backward()
        inner.step()
        dist.all_reduce(loss.detach())  # a global loss every step: the ranks wait for each other
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_loop_with_its_own_collective_every_step_ends_with_one_line_instead_of_hanging(tmp_path):
    script = tmp_path / "collective_loop.py"
    script.write_text(_COLLECTIVE_LOOP)
    done = subprocess.run([sys.executable, "-m", "geotrain", "emulate", "--cluster", str(MIXED), "--devices", "0,4",
                           "--time-scale", "0", "--timeout", "90", "--", str(script)], capture_output=True, text=True,
                          timeout=110, cwd=ROOT)
    assert done.returncode != 0
    assert "no request could be served" in done.stderr and "collective across ranks every step" in done.stderr, \
        done.stderr[-3000:]
