"""`geotrain train --pp-codec` with packed activation codecs: a 2-stage plan of the 2x2 cluster trains
with activations (and their gradients) crossing the cut as the codec's bytes in a float32 carrier."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from geotrain.codecs import get_codec
from runtime_2x2 import write_job_files

pytestmark = pytest.mark.timeout(300)
GEOTRAIN = [sys.executable, "-m", "geotrain"]
BATCH, CONTEXT, D_MODEL = 8, 96, 128  # per replica; the tiny preset's context and width
FP32_CUT_BYTES = BATCH * CONTEXT * D_MODEL * 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    files = write_job_files(tmp_path_factory.mktemp("job"))
    found = {}
    for codec in ("int8-block", "int4-block:block_size=64"):
        done = subprocess.run([*GEOTRAIN, "train", "--run-dir", "none", "--cluster", files["cluster"], "--plan",
                               files["plan"], "--time-scale", "0", "--steps", "6", "--pp-codec", codec, "--json"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        found[codec] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize("codec, block, ratio", [("int8-block", 256, 3.9), ("int4-block:block_size=64", 64, 7.1)])
def test_cut_bytes_are_the_codecs_and_the_loss_falls(runs, codec, block, ratio):
    run = runs[codec]
    name = codec.split(":")[0]
    per_sample = get_codec(name, block_size=block).wire_nbytes((CONTEXT, D_MODEL))
    assert run["bytes"]["pp_per_cut"] == BATCH * 4 * -(-per_sample // 4)  # the carrier: bytes rounded up to 4
    assert FP32_CUT_BYTES / run["bytes"]["pp_per_cut"] > ratio
    losses = run["losses"]
    assert losses[-1] < losses[0] - 0.5, losses
    assert run["config"]["pp_codec"] == codec
