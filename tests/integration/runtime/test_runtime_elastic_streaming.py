"""`geotrain train --elastic` with Streaming DiLoCo and a compressed outer exchange (--fragments 2
--sync-delay 1 --dp-codec int8-block, the codec reducer on torchft's group: geotrain.sync.elastic).
Without a fault, on a sharded plan (a replica group is a site's 2 processes holding FSDP2 shards, the outer sync per
shard, runtime/elastic/stage.py), it trains the non-elastic sharded run's numbers bit for bit; with group 1 (one
process, S = K = 1) SIGKILLed it finishes without a global restart, the restarted group recovers from its peer and
the replicas end equal. Three
launches, shared by the assertions, one after another in one process (tests/one_interpreter.py: the second and
third launches skip the seconds of imports of the first; none runs beside another, so the elastic timings are as
alone)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from one_interpreter import OneInterpreter
from paths import ROOT

pytest.importorskip("torchft")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]
CLUSTER = str(ROOT / "tests" / "data" / "wan-2x2.yaml")
RECIPE = ["--sync-every", "4", "--fragments", "2", "--sync-delay", "1", "--dp-codec", "int8-block"]
TINY = ["--model", "tiny-2layer", "--seq-len", "16", "--batch-size", "2", "--microbatches", "1", "--time-scale", "0",
        "--eval-windows", "64", "--json", "--run-dir", "none", *RECIPE]
ELASTIC = ["--elastic", "--heartbeat-timeout", "1.5", "--comm-timeout", "30"]
KILL_GROUP_1 = "kill-site:every=100s,first=1s,site=1,count=1"
KILLED_STEPS = 150
PLAN = {"stages": 1, "replicas": 2, "assignment": [[0, 1]]}
SHARDED = {"stages": 1, "replicas": 2, "assignment": [[0, 2]], "shards": {"k": 2, "devices": [[[0, 1], [2, 3]]]}}
"""Each replica one region's 2 devices (east: 0-1, west: 2-3), FSDP2 shards of the model."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic-streaming")
    plans = {name: tmp / f"{name}.json" for name in ("plan", "sharded")}
    for name, layout in (("plan", PLAN), ("sharded", SHARDED)):
        plans[name].write_text(json.dumps(layout))
    flags = {"elastic": ["--plan", str(plans["sharded"]), "--steps", "24", *ELASTIC],  # first: its fork server
             "killed": ["--plan", str(plans["plan"]), "--steps", str(KILLED_STEPS), *ELASTIC,  # imports torchft
                        "--chaos", KILL_GROUP_1],
             "plain": ["--plan", str(plans["sharded"]), "--steps", "24"]}
    process = OneInterpreter([["train", "--cluster", CLUSTER, *TINY, *words] for words in flags.values()], tmp, "runs",
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    found = {}
    for name, done in zip(flags, process.results()):
        assert done.returncode == 0, (name, done.stderr)
        found[name] = json.loads(done.stdout)
    return found


@pytest.mark.timeout(600)
def test_without_a_fault_an_elastic_streaming_int8_sharded_run_trains_the_non_elastic_numbers(runs):
    plain, elastic = runs["plain"], runs["elastic"]
    assert elastic["config"]["shards"] == plain["config"]["shards"] == 2
    assert len(elastic["losses"]) == 24 and elastic["losses"] == plain["losses"]
    assert elastic["summary"]["max_param_diff_across_replicas"] == 0.0  # the flush at the end: equal replicas
    # every sync step is a quorum: fragment 0 after steps 3, 7, ..., fragment 1 after 1, 5, ...; both at the end
    synced = [r["step"] for r in elastic["group_records"]["0"] if r["synced"]]
    assert synced == [*range(1, 23, 2), 23]


@pytest.mark.timeout(600)
def test_a_killed_group_rejoins_a_streaming_int8_run_without_a_global_restart(runs):
    run = runs["killed"]
    summary = run["summary"]
    assert summary["steps"] == KILLED_STEPS and summary["global_restarts"] == 0
    assert summary["replica_failures"] == 1 and summary["rejoins"] == 1 and summary["restarts"] == [0, 1]
    assert summary["max_param_diff_across_replicas"] == 0.0 and summary["replicas_in_sync"] is True
    rejoined = run["group_records"]["1"]
    first = rejoined[0]["step"]
    assert 0 < first < KILLED_STEPS and [r["step"] for r in rejoined] == list(range(first, KILLED_STEPS))
    # it recovered at a sync step: its first outer gradient repeats its peer's (weight 0), later ones count
    synced = [r for r in rejoined if r["synced"]]
    assert synced[0]["step"] == first and synced[0]["contributors"] == 1.0
    assert all(r["contributors"] == 2.0 for r in synced[1:])
    (validation,) = run["validation"]
    assert validation["loss"] < run["losses"][0] - 0.5  # it trained on (3.8 nats at step 0, ~2.8 at the end)
