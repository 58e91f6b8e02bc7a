"""`geotrain train --elastic --chaos partition:...`: a replica group whose emulated links are cut drops out
of the quorum while the others keep stepping (no restart of anything), and rejoins by live recovery when
the links heal, bit-identical to its peers. One launch, on the emulating backend (time scale 0.05)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from paths import ROOT

pytest.importorskip("torchft")
pytestmark = [pytest.mark.slow]
CLUSTER = str(ROOT / "tests" / "data" / "wan-2x2.yaml")
STEPS = 100


@pytest.fixture(scope="module")
def partitioned_run(tmp_path_factory):
    """3 replica groups (devices 0, 1 east; 2 west); group 1's links cut 1 s into training for 2 s."""
    tmp = tmp_path_factory.mktemp("partition")
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"stages": 1, "replicas": 3, "assignment": [[0, 1, 2]]}))
    done = subprocess.run(
        [sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan", str(plan), "--elastic",
         "--model", "tiny-2layer", "--seq-len", "16", "--batch-size", "2", "--microbatches", "1",
         "--time-scale", "0.05", "--heartbeat-timeout", "1.5", "--eval-windows", "4", "--steps", str(STEPS),
         "--comm-timeout", "10", "--chaos", "partition:site=1,at=1s,for=2s", "--json"],
        capture_output=True, text=True, timeout=150, cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.timeout(200)
def test_a_partitioned_group_drops_out_the_others_keep_stepping_and_it_rejoins_identical(partitioned_run):
    run = partitioned_run
    assert (run["steps"], run["partitions"], run["replica_failures"], run["global_restarts"]) == (STEPS, 1, 0, 0)
    assert run["kills"] == 0 and run["restarts"] == [0, 0, 0] and run["groups_finished"] == [0, 1, 2]
    records = {int(g): {r["step"]: r for r in rs} for g, rs in run["group_records"].items()}
    # the others never stopped: every step, committed by them; the partitioned group missed a stretch
    assert sorted(records[0]) == sorted(records[2]) == list(range(STEPS))
    missed = sorted(set(range(STEPS)) - set(records[1]))
    assert missed and missed == list(range(missed[0], missed[-1] + 1)) and missed[-1] < STEPS - 1
    contributors = run["contributors"]
    assert contributors[0] == 3.0 and contributors[-1] == 3.0
    assert all(contributors[t] == 2.0 for t in missed)  # the quorum dropped it while its links were down
    # it came back by live recovery, and from its first sync on it equals its peers bit for bit
    assert run["rejoins"] >= 1 and len(run["partition_recovery_s"]) == 1 and 0 <= run["partition_recovery_s"][0] < 10
    back = missed[-1] + 1
    for step in range(back, STEPS):
        assert records[1][step]["params_sha256"] == records[0][step]["params_sha256"] == records[2][step]["params_sha256"]
    assert run["max_param_diff_across_replicas"] == 0.0
    # emulated: the groups' clock ran on the cluster's links (device 2 is 80 ms away: > 80 ms a step)
    assert run["train_emulated_s"] > 0.08 * STEPS
