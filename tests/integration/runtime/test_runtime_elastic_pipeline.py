"""`geotrain train --elastic` with pipeline S = 2: a replica group is its 2 stage processes (one torchft
Manager each, one pipeline group between them). A chaos partition of group 1 cuts both its stages' links at once:
they drop out of the quorum together (no restart of anything) and rejoin by live recovery after the heal, each
stage from the same stage of group 0; then a stage process that dies alone takes its group with it: the launcher
restarts the group as a whole, counted once, and it rejoins by live recovery, while group 0 commits every step.
On emulated links, each stage process on its own device: the stage-to-stage sends inside a region, every step's
gradient mean between the regions; at --time-scale 0.02, since the default (1) would sleep out 200 steps of 80 ms
WAN rounds (about 40 s more: the bytes and emulated times do not depend on the scale). One launch, shared by the
assertions."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paths import ROOT
from proctree import comm, descendants

pytest.importorskip("torchft")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]
CLUSTER = str(ROOT / "tests" / "data" / "wan-2x2.yaml")
STEPS = 200
STAGE_PROCESSES = ("geotrain-g0s0", "geotrain-g0s1", "geotrain-g1s0", "geotrain-g1s1")
TIME_SCALE = 0.02
MODEL_FP32_BYTES = 4 * 288_768
"""tiny-2layer's parameters (models/presets.py, tests/unit/models/test_models_presets.py) in fp32: what a run that
is not elastic of this plan sends per step between the regions per replica (each stage's gradient once: a ring
all-reduce of 2 members)."""


@pytest.fixture(scope="module")
def killed_pipeline_run(tmp_path_factory):
    """S = 2, R = 2 (stage 0 on devices 0 and 2, stage 1 on 1 and 3); group 1's links cut by the chaos 1 s
    into training for 2 s; then (by this test) its stage 1 process alone SIGKILLed, once the healed group has
    rejoined (the launcher's line; a kill while the groups still meet would stall the survivor for --comm-timeout,
    docs/history/fault_tolerance.md, and leave no rejoin to count).
    Returns the JSON summary and every pid seen per stage process name."""
    tmp = tmp_path_factory.mktemp("pipeline")
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"stages": 2, "replicas": 2, "assignment": [[0, 2], [1, 3]]}))
    out, err = (tmp / "summary.json").open("w"), (tmp / "stderr.txt").open("w")  # files: a pipe would fill up
    launcher = subprocess.Popen(
        [sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan", str(plan), "--elastic",
         "--model", "tiny-2layer", "--seq-len", "16", "--batch-size", "2", "--microbatches", "2",
         "--time-scale", str(TIME_SCALE), "--heartbeat-timeout", "1.5", "--comm-timeout", "30", "--eval-windows", "4",
         "--steps", str(STEPS),
         "--chaos", "partition:site=1,at=1s,for=2s", "--json"],
        stdout=out, stderr=err, cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    seen: dict[str, list[int]] = {name: [] for name in STAGE_PROCESSES}
    stage_killed = False
    deadline = time.monotonic() + 180
    while launcher.poll() is None and time.monotonic() < deadline:
        for pid in descendants(launcher.pid):
            name = comm(pid)
            if name in seen and pid not in seen[name]:
                seen[name].append(pid)
        # group 1's stage 1, once the group has rejoined after the heal (its processes never restarted)
        if not stage_killed and seen["geotrain-g1s1"] and "rejoined" in (tmp / "stderr.txt").read_text():
            os.kill(seen["geotrain-g1s1"][0], signal.SIGKILL)
            stage_killed = True
        time.sleep(0.1)
    if launcher.poll() is None:
        launcher.kill()  # the supervisor's guardian stops the rest
    launcher.wait(timeout=60)
    out.close()
    err.close()
    assert launcher.returncode == 0, (tmp / "stderr.txt").read_text()[-2000:]
    return json.loads((tmp / "summary.json").read_text()), seen


@pytest.mark.timeout(240)
def test_a_failed_group_of_two_stages_restarts_as_one_and_rejoins_without_a_global_restart(killed_pipeline_run):
    doc, seen = killed_pipeline_run
    run = doc["summary"]  # train --json's layout: the elastic facts in its summary
    assert doc["config"]["stages"] == doc["stages"] == 2 and run["steps"] == STEPS
    # the partition restarted nothing; one failure of group 1 (its stage 1 alone), counted once, a restart of
    # both its stages; group 0's processes never changed
    assert (run["partitions"], run["kills"], run["replica_failures"], run["restarts"]) == (1, 0, 1, [0, 1])
    assert {name: len(pids) for name, pids in seen.items()} == {"geotrain-g0s0": 1, "geotrain-g0s1": 1,
                                                                "geotrain-g1s0": 2, "geotrain-g1s1": 2}
    assert run["rejoins"] == 2 and run["global_restarts"] == 0 and run["groups_finished"] == [0, 1]
    assert len(run["recovery_s"]) == 1 and all(0 < s < 60 for s in run["recovery_s"])
    assert len(run["partition_recovery_s"]) == 1
    assert run["max_param_diff_across_replicas"] == 0.0  # stage s against stage s, both stages
    assert len(doc["losses"]) == STEPS and all(math.isfinite(loss) for loss in doc["losses"])
    assert math.isfinite(run["val_loss"]) and run["val_loss"] < doc["losses"][0]


@pytest.mark.timeout(240)
def test_group_0_commits_every_step_and_each_rejoined_stage_equals_its_peer_stage_bit_for_bit(killed_pipeline_run):
    doc = killed_pipeline_run[0]
    survivor, rejoined = (doc["group_records"][g] for g in ("0", "1"))
    assert [r["step"] for r in survivor] == list(range(STEPS))
    first = rejoined[0]["step"]  # the records of group 1's last start: after its stage 1 was killed
    assert 0 < first < STEPS and [r["step"] for r in rejoined] == list(range(first, STEPS))
    stages = {r["step"]: r["stage_params_sha256"] for r in survivor}
    assert all(len(r["stage_params_sha256"]) == 2 and r["stage_params_sha256"] == stages[r["step"]]
               for r in rejoined)
    # the loss is the last stage's, on every step of the survivor; 2 groups contribute again once it is back
    assert all(r["loss"] is not None for r in survivor) and rejoined[0]["contributors"] == 2.0
    # the partition: group 1 was in from the start, then out (group 0 stepped alone), then back by live recovery
    # after the heal, before the kill; without a restart (test above)
    healed = [int(m.group(1)) for line in doc["events"]
              if (m := re.search(r"replica group 1 \(.*\) rejoined at step (\d+)", line))]
    assert len(healed) == 2 and 0 < healed[0] <= first  # the kill may land at the step the heal rejoined at
    assert survivor[0]["contributors"] == 2.0 and survivor[healed[0] - 1]["contributors"] == 1.0


@pytest.mark.timeout(240)
def test_between_regions_each_group_sends_its_gradient_once_per_step_as_a_run_that_is_not_elastic(
        killed_pipeline_run):
    """Every step both groups contribute to, each group sends its model's fp32 gradient between the regions (its 2
    stages' parts; a run that is not elastic sends the same) plus one fp32 weight per stage (the quorum's weight
    sum rides in the all-reduce, geotrain.sync.elastic); the pipeline's sends stay in the region. A step whose
    first try died with its peer also sent that try's part (at most one such step per failure or partition)."""
    run = killed_pipeline_run[0]
    records = [r for g in ("0", "1") for r in run["group_records"][g]]
    both = [r["inter_region_bytes"] for r in records if r["contributors"] == 2.0]
    per_step = MODEL_FP32_BYTES + 2 * 4
    retried = [b for b in both if b != per_step]
    assert len(both) >= STEPS and len(retried) <= run["summary"]["replica_failures"] + run["summary"]["partitions"]
    assert all(b > per_step for b in retried)
    assert all(r["sent_bytes"] > r["inter_region_bytes"] for r in records)  # activations and their gradients too
    assert killed_pipeline_run[0]["summary"]["train_emulated_s"] > 0
