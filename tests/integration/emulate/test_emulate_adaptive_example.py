"""examples/adaptive_diloco.py under `geotrain emulate --emulate-gpu-speed` on an A100 and a T4 site: the loop
learns, and with adaptive local steps the A100 rank takes more inner steps (equal: the same on both); with
asynchronous outer updates too, as the server serves in emulated time."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from paths import ROOT

pytestmark = pytest.mark.slow  # a launch of real processes per test

MIXED = ROOT / "examples" / "clusters" / "mixed-gpus-3x2.yaml"  # device 0: A100, device 4: T4
FIELD = re.compile(r"(\w+) (\[[^\]]*\]|\S+)")


def run_example(local_steps: str, outer_sync: str = "sync") -> dict[int, dict[str, str]]:
    """Each rank's closing line of the example, as {field: value}, by rank."""
    command = [sys.executable, "-m", "geotrain", "emulate", "--cluster", str(MIXED), "--devices", "0,4",
               "--time-scale", "0", "--emulate-gpu-speed", "--compute-clock", "cpu",
               "--timeout", "250", "--", "examples/adaptive_diloco.py",
               "--periods", "5", "--sync-every", "4", "--hidden", "256", "--batch", "64", "--local-steps", local_steps,
               "--outer-sync", outer_sync]
    done = subprocess.run(command, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, capture_output=True,
                          text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [dict(FIELD.findall(line)) for line in done.stdout.splitlines() if line.startswith("rank ")]
    ranks = {int(fields["rank"]): fields for fields in lines}
    assert sorted(ranks) == [0, 1], done.stdout
    return ranks


@pytest.mark.timeout(300)
@pytest.mark.parametrize("local_steps", ["adaptive", "equal"])
def test_the_example_learns_and_the_a100_rank_takes_more_inner_steps_when_adaptive(local_steps):
    ranks = run_example(local_steps)
    a100, t4 = ranks[0], ranks[1]
    for fields in (a100, t4):
        assert fields["periods"] == "5" and fields["local_steps"] == local_steps
        assert float(fields["val_loss_after"]) < 0.7 * float(fields["val_loss_before"])  # it learns
        assert float(fields["train_loss_last_period"]) < float(fields["train_loss_first_period"])
        assert 0.0 < float(fields["compute_fraction"]) <= 1.0
    assert a100["val_loss_after"] == t4["val_loss_after"]  # one model on every rank after the last sync
    total = int(a100["inner_steps"]) + int(t4["inner_steps"])
    assert total == 2 * 5 * 4  # the same samples either way: R x H inner steps per period
    if local_steps == "adaptive":
        assert int(a100["inner_steps"]) > int(t4["inner_steps"]), (a100, t4)
    else:
        assert a100["inner_steps"] == t4["inner_steps"] == "20"


@pytest.mark.timeout(300)
def test_the_example_with_asynchronous_updates_learns_and_the_a100_rank_sends_more():
    ranks = run_example("equal", "async")
    a100, t4 = ranks[0], ranks[1]
    for fields in (a100, t4):
        assert fields["outer_sync"] == "async" and int(fields["outer_updates"]) >= 2 * 5  # periods x replicas
        assert float(fields["val_loss_after"]) < 0.7 * float(fields["val_loss_before"])  # it learns
        assert 0.0 < float(fields["compute_fraction"]) <= 1.0
    assert a100["val_loss_after"] == t4["val_loss_after"]  # every rank leaves with the final global model
    # served in emulated time: the A100 (4.8x the T4's peak) sends its H steps more often; by wall time alike
    assert int(a100["inner_steps"]) > int(t4["inner_steps"]), (a100, t4)
