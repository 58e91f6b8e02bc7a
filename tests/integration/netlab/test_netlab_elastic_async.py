"""`geotrain train --elastic --netlab --outer-sync async` (root, network namespaces): each replica group runs in its
plan device's lab namespace and the global model's host serves on its lab address, published to the others, who
push over the lab's shaped links (the west group over 100 Mbit/s). The host is SIGKILLed: the clients elect a new one,
which listens on and publishes its own lab address (a loopback address would be out of reach in another namespace:
the run could not go on); a partition of another group (its site cut off in the lab) holds its messages, as TCP does, until
the heal. One launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lab_marks import NEEDS_LAB
from paths import ROOT

pytestmark = [pytest.mark.slow, NEEDS_LAB]
CLUSTER = str(ROOT / "tests" / "data" / "wan-2x2.yaml")
STEPS = 60


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    """3 replica groups (devices 0, 1 east; 2 west), group 0 hosting the global model first; the host killed 1.5 s
    into training, group 2's site cut off at 0.5 s for 1.5 s."""
    tmp = tmp_path_factory.mktemp("netlab-async")
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"stages": 1, "replicas": 3, "assignment": [[0, 1, 2]]}))
    done = subprocess.run(
        [sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan", str(plan), "--elastic", "--netlab",
         "--time-scale", "0", "--outer-sync", "async", "--sync-every", "3", "--model", "tiny-2layer", "--seq-len",
         "16", "--batch-size", "2", "--microbatches", "1", "--heartbeat-timeout", "3", "--eval-windows", "4",
         "--steps", str(STEPS), "--comm-timeout", "10", "--run-dir", "none", "--json", "--chaos",
         "kill-site:every=100s,first=1.5s,site=host,count=1;partition:site=2,at=0.5s,for=1.5s"],
        capture_output=True, text=True, timeout=200, cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.timeout(250)
def test_the_global_model_s_host_is_re_elected_on_its_lab_address_and_the_groups_end_on_one_model(lab_run):
    run = lab_run["summary"]
    assert (run["kills"], run["partitions"], run["global_restarts"]) == (1, 1, 0)
    assert run["elections"] >= 1 and run["restarts"][0] == 1  # the killed host's group came back as a client
    assert run["groups_finished"] == [0, 1, 2] and run["max_param_diff_across_replicas"] == 0.0
    # the groups pushed to the first host and to the elected one, both over the lab (a group's records: its pushes)
    assert all(any(r["synced"] for r in records) for records in lab_run["group_records"].values())
    assert run["global_updates"] > 0
