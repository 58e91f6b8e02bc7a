"""`geotrain train --elastic --netlab --chaos partition:...` (root, network namespaces): each replica group
runs in its plan device's lab namespace over real shaped TCP; the partition cuts group 1's site off
(netlab.cuts), so its peers learn of it only by their collective timeout (no error from a silent link), go on
without it, and it rejoins by torchft live recovery over the lab when the cut heals, bit-identical
to its peers; nothing is restarted and the lab is gone when the launcher ends. One launch."""

from __future__ import annotations

import json
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
STEPS = 100
COMM_TIMEOUT_S = 3.0
HEARTBEAT_TIMEOUT_S = 3.0
"""Not 1.5 s: under a suite's load a group's heartbeats once paused that long at the start, the Lighthouse formed the
start-up quorum without it, and it joined at step 1 by recovery."""


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    """3 replica groups (devices 0, 1 east; 2 west: 10 Gbit/s and 100 Mbit/s lab links); group 1's site cut
    off 1 s into training for 6 s (twice the heartbeat timeout: the others train on without it before the heal)."""
    tmp = tmp_path_factory.mktemp("netlab-partition")
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"stages": 1, "replicas": 3, "assignment": [[0, 1, 2]]}))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan", str(plan), "--elastic", "--netlab",
         "--time-scale", "0", "--model", "tiny-2layer", "--seq-len", "16", "--batch-size", "2", "--microbatches", "1",
         "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S), "--eval-windows", "4", "--steps", str(STEPS),
         "--comm-timeout", str(COMM_TIMEOUT_S), "--chaos", "partition:site=1,at=1s,for=6s", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    try:
        out, err = launcher.communicate(timeout=150)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err[-2000:]
    return json.loads(out), launcher.pid


@pytest.mark.timeout(200)
def test_a_group_cut_off_in_the_lab_drops_out_the_others_go_on_and_it_rejoins_identical(lab_run):
    doc, launcher_pid = lab_run
    run = doc["summary"]  # train --json's layout: the elastic facts in its summary
    assert (run["steps"], run["partitions"], run["global_restarts"], run["replica_failures"]) == (STEPS, 1, 0, 0)
    assert run["restarts"] == [0, 0, 0] and run["groups_finished"] == [0, 1, 2]  # the cut restarted nothing
    records = {int(g): {r["step"]: r for r in rs} for g, rs in doc["group_records"].items()}
    assert sorted(records[0]) == sorted(records[2]) == list(range(STEPS))  # the others never stopped
    missed = sorted(set(range(STEPS)) - set(records[1]))
    assert missed and missed == list(range(missed[0], missed[-1] + 1)) and missed[-1] < STEPS - 1
    contributors = run["contributors"]
    assert contributors[0] == contributors[-1] == 3.0
    # the step in flight when the port went down may have reached the survivors whole (group 1's slice
    # averaged in, 3 contributors) while group 1 itself failed before it committed (seen once under load);
    # every later step it missed was averaged over the two others only
    assert contributors[missed[0]] in (2.0, 3.0), (missed, contributors)
    assert all(contributors[t] == 2.0 for t in missed[1:]), (missed, contributors)
    # a port down raises nothing: the survivors wait until the Lighthouse has dropped the silent group, which it
    # does a heartbeat timeout after group 1's last heartbeat, and (when a collective with group 1 was in flight
    # at the cut) the collective timeout first. The heartbeat timeout is no lower bound of the stall: under a
    # suite's load group 1's heartbeats can pause before the cut (fresh-clone CI saw a 1.69 s stall at a 3 s
    # heartbeat timeout), and the wait can fall across two step records. What always holds: the longest
    # survivor step is a stall, well above their 90th-percentile step (a quiet run: 0.17 s, stall 3.2 s), and it
    # ends within the timeouts' sum
    walls = sorted(r["wall_s"] for g in (0, 2) for r in records[g].values())
    p90_wall_s = walls[int(0.9 * len(walls))]
    assert 3 * p90_wall_s < run["stall_s"] < COMM_TIMEOUT_S + 10 * HEARTBEAT_TIMEOUT_S, (p90_wall_s, run["stall_s"])
    # it came back by live recovery over the lab and equals its peers from its first sync on
    assert run["rejoins"] >= 1 and len(run["partition_recovery_s"]) == 1 and 0 <= run["partition_recovery_s"][0] < 10
    for step in range(missed[-1] + 1, STEPS):
        assert records[1][step]["params_sha256"] == records[0][step]["params_sha256"] \
            == records[2][step]["params_sha256"]
    assert run["max_param_diff_across_replicas"] == 0.0
    # the lab (and with it every process that ran inside it: groups, Lighthouse) is gone
    left = [name for name in os.listdir(NETNS_DIR) if name.startswith(f"gt{launcher_pid}-")] \
        if os.path.isdir(NETNS_DIR) else []
    assert left == []
