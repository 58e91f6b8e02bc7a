"""`geotrain train --pp-codec` with packed activation codecs: a 2-stage plan of the 2x2 cluster trains
with activations (and their gradients) crossing the cut as the codec's bytes in a float32 carrier; with the
per-sample delta wire (runtime/delta_wire.py) both stages end with the same state."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from geotrain.codecs import get_codec
from runtime_2x2 import write_job_files

pytestmark = pytest.mark.timeout(300)
GEOTRAIN = [sys.executable, "-m", "geotrain"]
BATCH, CONTEXT, D_MODEL = 8, 96, 128  # per replica; the tiny preset's context and width
FP32_CUT_BYTES = BATCH * CONTEXT * D_MODEL * 4
DELTA = "delta:codec=int2-block,first=int8-block,grad=int2-block,feedback=true"  # gradients with error feedback


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    files = write_job_files(tmp_path_factory.mktemp("job"))
    found = {}
    epochs = ["--windows", "epochs", "--epoch-windows", "8"]  # an epoch per replica a step
    folder = tmp_path_factory.mktemp("ck")
    checkpoints = ["--checkpoint-dir", str(folder), "--checkpoint-every", "3"]
    for name, codec, extra in (("int8-block", "int8-block", []), ("int4-block:block_size=64", "int4-block:block_size=64",
                                                                  []),
                               (DELTA, DELTA, [*epochs, *checkpoints]),
                               ("delta-resumed", DELTA, [*epochs, *checkpoints, "--resume"])):
        if name == "delta-resumed":  # resume from the delta run's checkpoint after 3 steps
            shutil.rmtree(folder / "step-000006")
            (folder / "latest").write_text("step-000003")
        done = subprocess.run([*GEOTRAIN, "train", "--run-dir", "none", "--cluster", files["cluster"], "--plan",
                               files["plan"], "--time-scale", "0", "--steps", "6", "--pp-codec", codec, *extra,
                               "--json"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        found[name] = json.loads(done.stdout)
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


def test_a_delta_cut_keeps_the_same_state_on_both_stages_and_sends_first_sights_wider(runs):
    run = runs[DELTA]
    for replica in (0, 1):  # each replica's cut has its two sides, each with its own state
        sender, receiver = sorted((side for side in run["cut_state"] if side["replica"] == replica),
                                  key=lambda side: side["stage"])
        assert sender["samples"] == receiver["samples"] == 8  # every window of the 8 has been seen
        assert sender["state_bytes"] == 8 * CONTEXT * D_MODEL * 4
        assert sender["fingerprint"] == receiver["fingerprint"]
        assert (sender["residual_samples"], receiver["residual_samples"]) == (0, 8)  # the gradient residuals: receiver
    row_bytes = {name: 4 * -(-get_codec(name).wire_nbytes((CONTEXT, D_MODEL)) // 4) for name in ("int2-block",
                                                                                                   "int8-block")}
    narrow, wide = (BATCH * (4 + row_bytes[name]) for name in ("int2-block", "int8-block"))  # + the id per row
    assert run["bytes"]["pp_per_cut"] == narrow  # the last step: deltas
    assert run["bytes"]["pp_total"] == wide + 5 * narrow  # the first step's first sights at int8-block
    assert FP32_CUT_BYTES / narrow > 14
    losses = run["losses"]
    assert losses[-1] < losses[0] - 0.5, losses


def test_a_delta_cut_resumed_from_a_checkpoint_sends_deltas_and_ends_as_the_uninterrupted_run(runs):
    whole, resumed = runs[DELTA], runs["delta-resumed"]
    # the per-sample state came back: the resumed steps sent deltas (no second round of first sights) and both
    # sides of each cut end with the uninterrupted run's state (the gradient residuals too), its losses and its bytes
    assert resumed["cut_state"] == whole["cut_state"]
    assert resumed["losses"] == whole["losses"]
    assert resumed["bytes"]["pp_total"] == whole["bytes"]["pp_total"]
