"""`DiLoCo(local_steps="adaptive")` under `geotrain emulate --emulate-gpu-speed`: the inner steps are timed by the
rank's emulated clock (compute at its GPU's speed), not by wall seconds (every rank runs on this one CPU), so an
A100 rank takes more inner steps per period than a T4 rank. `--compute-clock cpu`: each rank's CPU seconds, so the
machine's load does not enter the emulated speeds."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from geotrain.comm import run_workers
from geotrain.diloco import DiLoCo
from geotrain.emulate import emulated_clock
from paths import ROOT

MIXED = ROOT / "examples" / "clusters" / "mixed-gpus-3x2.yaml"  # device 0: A100, device 4: T4 (312 / 65 = 4.8x)
PERIODS, H = 5, 4

_SCRIPT = """
import json, sys, time
import torch
import torch.distributed as dist
from geotrain.diloco import DiLoCo
from geotrain.emulate import emulated_clock

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.Tanh(), torch.nn.Linear(512, 1))
inner = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.Generator().manual_seed(rank)
diloco = DiLoCo(model, inner, sync_every=PERIOD_H, local_steps="adaptive", codec="none")
dist.barrier()
with diloco:
    while diloco.outer_step < PERIODS:
        x = torch.randn(128, 64, generator=data)
        inner.zero_grad()
        torch.nn.functional.mse_loss(model(x), x[:, :1]).backward()
        inner.step()
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as handle:
    json.dump({"emulated": emulated_clock() is not None and diloco.clock is not time.perf_counter,
               "inner_steps": diloco.inner_steps, "steps": [h["steps"] for h in diloco.sync.history]}, handle)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_a100_rank_takes_more_inner_steps_than_a_t4_rank_under_emulated_gpu_speed(tmp_path):
    script = tmp_path / "adaptive.py"
    script.write_text(_SCRIPT.replace("PERIOD_H", str(H)).replace("PERIODS", str(PERIODS)))
    subprocess.run([sys.executable, "-m", "geotrain", "emulate", "--cluster", str(MIXED), "--devices", "0,4",
                    "--time-scale", "0", "--emulate-gpu-speed", "--compute-clock", "cpu", "--timeout", "250", "--", str(script), str(tmp_path)],
                   check=True, timeout=280, cwd=ROOT)
    a100, t4 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert a100["emulated"] and t4["emulated"]
    assert a100["steps"] == t4["steps"]  # every rank agrees on who took how many steps
    # periods 1-2: H each (nothing measured yet; period 1's times travel during period 2); then the 2 x H = 8 steps
    # of a period are shared by emulated speed, 4.8 : 1 ideally (7 : 1 in integers); by wall seconds (the same CPU
    # for both) about 4 : 4
    assert a100["steps"][:2] == [[H, H], [H, H]]
    later = a100["steps"][2:]
    assert all(sum(period) == 2 * H for period in later)
    a100_steps, t4_steps = sum(p[0] for p in later), sum(p[1] for p in later)
    assert a100_steps >= 2 * t4_steps, a100["steps"]
    assert a100["inner_steps"] > t4["inner_steps"]


def _clock_of_plain_gloo(rank: int, world: int) -> tuple[bool, bool]:
    import torch

    model = torch.nn.Linear(2, 1)
    diloco = DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2, local_steps="adaptive",
                    codec="none")
    return emulated_clock() is None and emulated_clock(dist.group.WORLD) is None, diloco.clock is time.perf_counter


def test_without_the_emulating_backend_diloco_times_its_steps_in_wall_seconds():
    assert emulated_clock() is None  # no process group in this process
    assert run_workers(_clock_of_plain_gloo, 2, timeout_s=120) == [(True, True), (True, True)]
