"""Unmodified torch scripts (examples/: DDP, pipelining, FSDP2) under `geotrain emulate` train exactly as
under plain gloo."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two launches of real processes per test
ROOT = Path(__file__).resolve().parents[1]
LOSS = re.compile(r"step (\d+) loss (\S+) time")


def losses(output: str) -> list[str]:
    return [m.group(2) for m in LOSS.finditer(output)]


def run(command: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("script", ["examples/ddp_train.py", "examples/pipeline_train.py", "examples/fsdp_train.py"])
def test_example_losses_are_bit_identical_to_plain_gloo(script, tmp_path):
    args = [script, "--steps", "3", "--hidden", "32"]
    plain = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", *args])
    emulated = run([sys.executable, "-m", "geotrain", "emulate", "--cluster", "seed-geo", "--devices", "0,9,17",
                    "--time-scale", "0", "--timeout", "250", "--", *args])
    assert len(losses(plain)) == 3
    assert losses(emulated) == losses(plain)  # printed with 8 decimals: same float32 values
