"""`geotrain train --elastic --netlab` with pipeline S = 2 (root, network namespaces): each of a replica group's 2
stage processes runs in its own plan device's lab namespace (the stage-to-stage sends on its region's lab links, each
stage's gradient mean on the lab's links between the regions, the group's store on its stage 0's address). Group 1,
killed by the chaos 1 s into training, is restarted as one and comes back over the lab (by live recovery, or, when
group 0 finished first, with group 0's final parameters: runtime/elastic/late.py): one model at the end, nothing
restarted globally, and the lab is gone when the launcher ends. One launch."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from geotrain.netlab.names import NETNS_DIR
from lab_marks import NEEDS_LAB
from paths import ROOT

pytest.importorskip("torchft")
pytestmark = [pytest.mark.slow, NEEDS_LAB]
CLUSTER = str(ROOT / "tests" / "data" / "wan-2x2.yaml")
STEPS = 60


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    """S = 2, R = 2 (stage 0 on devices 0 and 2, stage 1 on 1 and 3: 4 lab namespaces); group 1 SIGKILLed 1 s in."""
    tmp = tmp_path_factory.mktemp("netlab-pipeline")
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"stages": 2, "replicas": 2, "assignment": [[0, 2], [1, 3]]}))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan", str(plan), "--elastic", "--netlab",
         "--time-scale", "0", "--model", "tiny-2layer", "--seq-len", "16", "--batch-size", "2", "--microbatches", "2",
         "--heartbeat-timeout", "3", "--comm-timeout", "10", "--eval-windows", "4", "--steps", str(STEPS),
         "--chaos", "kill-site:every=100s,first=1s,site=1,count=1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    try:
        out, err = launcher.communicate(timeout=200)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err[-2000:]
    return json.loads(out), launcher.pid


@pytest.mark.timeout(260)
def test_a_group_of_two_stage_processes_in_their_own_lab_namespaces_trains_restarts_as_one_and_ends_on_one_model(
        lab_run):
    doc, launcher_pid = lab_run
    run = doc["summary"]
    assert doc["stages"] == 2 and run["steps"] == STEPS
    assert (run["kills"], run["replica_failures"], run["restarts"], run["global_restarts"]) == (1, 1, [0, 1], 0)
    assert run["groups_finished"] == [0, 1] and run["max_param_diff_across_replicas"] == 0.0
    survivor = doc["group_records"]["0"]
    assert [r["step"] for r in survivor] == list(range(STEPS))  # group 0 never stopped
    # both groups from the start; whether group 0 then commits a step alone depends on where the kill lands against
    # the restarted group's return (a quiet machine: the restarted group can rejoin before the dead one's heartbeats
    # expire, so every committed step counts 2): the restart as one is `restarts` [0, 1] above
    assert survivor[0]["contributors"] == 2.0
    assert all(r["loss"] is not None for r in survivor) and math.isfinite(run["val_loss"])
    left = [name for name in os.listdir(NETNS_DIR) if name.startswith(f"gt{launcher_pid}-")] \
        if os.path.isdir(NETNS_DIR) else []
    assert left == []  # the lab (and every process that ran in it) is gone
