"""`geotrain train --elastic` with pipeline S = 2: a replica group is its 2 stage processes (one torchft
Manager each, one pipeline group between them). A chaos kill of group 1 kills both its stages; the
launcher restarts the group as a whole, counted once; it rejoins by live recovery (each stage from the
same stage of group 0) while group 0 commits every step. One launch, shared by the assertions."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from paths import ROOT

pytest.importorskip("torchft")
pytestmark = [pytest.mark.slow]
CLUSTER = str(ROOT / "tests" / "data" / "wan-2x2.yaml")
STEPS = 150


@pytest.fixture(scope="module")
def killed_pipeline_run(tmp_path_factory):
    """S = 2, R = 2 (stage 0 on devices 0 and 2, stage 1 on 1 and 3); group 1 SIGKILLed 1 s into training."""
    tmp = tmp_path_factory.mktemp("pipeline")
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"stages": 2, "replicas": 2, "assignment": [[0, 2], [1, 3]]}))
    done = subprocess.run(
        [sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan", str(plan), "--elastic",
         "--model", "tiny-2layer", "--seq-len", "16", "--batch-size", "2", "--microbatches", "2",
         "--time-scale", "0", "--heartbeat-timeout", "1.5", "--eval-windows", "4", "--steps", str(STEPS),
         "--chaos", "kill-site:every=100s,first=1s,site=1,count=1", "--json"],
        capture_output=True, text=True, timeout=200, cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.timeout(240)
def test_a_killed_group_of_two_stages_restarts_as_one_and_rejoins_without_a_global_restart(killed_pipeline_run):
    run = killed_pipeline_run
    assert run["config"]["stages"] == 2 and run["steps"] == STEPS
    assert run["kills"] == 1 and run["replica_failures"] == 1 and run["restarts"] == [0, 1]  # the group, once
    assert run["rejoins"] == 1 and run["global_restarts"] == 0 and run["groups_finished"] == [0, 1]
    assert len(run["recovery_s"]) == 1 and 0 < run["recovery_s"][0] < 60
    assert run["max_param_diff_across_replicas"] == 0.0  # stage s against stage s, both stages
    assert len(run["losses"]) == STEPS and all(math.isfinite(loss) for loss in run["losses"])
    assert math.isfinite(run["val_loss"]) and run["val_loss"] < run["losses"][0]


@pytest.mark.timeout(240)
def test_group_0_commits_every_step_and_each_rejoined_stage_equals_its_peer_stage_bit_for_bit(killed_pipeline_run):
    survivor, rejoined = (killed_pipeline_run["group_records"][g] for g in ("0", "1"))
    assert [r["step"] for r in survivor] == list(range(STEPS))
    first = rejoined[0]["step"]
    assert 0 < first < STEPS and [r["step"] for r in rejoined] == list(range(first, STEPS))
    stages = {r["step"]: r["stage_params_sha256"] for r in survivor}
    assert all(len(r["stage_params_sha256"]) == 2 and r["stage_params_sha256"] == stages[r["step"]]
               for r in rejoined)
    # the loss is the last stage's, on every step of the survivor; 2 groups contribute again once it is back
    assert all(r["loss"] is not None for r in survivor) and rejoined[0]["contributors"] == 2.0
