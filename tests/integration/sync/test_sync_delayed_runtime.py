"""`geotrain train --sync-delay TAU` without --sync-every (delayed gradients, geotrain.sync.delayed) in the
runtime: real processes on the 2x2 test plan over the emulating backend, one launch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runtime_2x2 import write_job_files

GEOTRAIN = [sys.executable, "-m", "geotrain"]


@pytest.mark.timeout(300)
def test_train_lands_each_gradient_exchange_one_step_late_and_keeps_replicas_equal(tmp_path):
    """tau = 1, 5 steps: step 0 lands nothing, steps 1-3 land one exchange each (the previous step's), the last
    step lands two (its predecessor's and its own); each landing step records the posted collective's bytes
    and its emulated link time as DP communication; the replicas agree on every step."""
    files = write_job_files(tmp_path)
    done = subprocess.run([*GEOTRAIN, "train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"],
                           "--time-scale", "1e-3", "--steps", "5", "--dp-codec", "int8-block", "--sync-delay", "1",
                           "--json"], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    nbytes = [row["dp_bytes"] for row in report["iterations"]]
    seconds = [row["comm_measured"]["dp"] for row in report["iterations"]]
    assert nbytes[0] == 0 and nbytes[1] > 0 and nbytes[1] == nbytes[2] == nbytes[3]
    assert nbytes[4] == 2 * nbytes[1]
    assert [s > 0 for s in seconds] == [False, True, True, True, True]
    assert report["summary"]["replicas_in_sync"]
    assert all(loss == loss for loss in report["losses"])  # finite: no NaN from a mean applied twice or never
