"""Elastic runs that train the non-elastic runs' numbers, side by side in two interpreters (elastic, plain), each
running two command lines in turn.

`train --elastic --sync-every H --sync-moments`: the inner AdamW's moments travel in the elastic outer sync's try
(the first moment through the outer codec with error feedback, the second through log-block), so a fault-free
elastic run trains the non-elastic moment-sync run's numbers. Without the moments the same elastic run's losses leave
these from the first step after the first sync (measured: 0.006 to 0.029 nats at steps 5-8 with int8-block).

`train --elastic --optimizer onebit-adam`: 1-bit Adam's exchange on the torchft quorum (geotrain.sync.elastic_onebit):
its fp32 warm-up all-reduce (the non-elastic buffer: gloo sums it in the same order) and its 1-bit all-to-all and
all-gather carry the non-elastic run's messages, so the losses are equal bit for bit, and so are the bytes per step
but for this group's 4-byte weight after its 1-bit all-gather (what the quorum's contributors sum). The killed-group
run is test_runtime_elastic.py's per-step launch."""

from __future__ import annotations

import json
import os

import pytest

from one_interpreter import OneInterpreter, results_of
from paths import ROOT

pytest.importorskip("torchft")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
CLUSTER = str(ROOT / "tests" / "data" / "wan-2x2.yaml")
COMMON = ["--model", "tiny-2layer", "--seq-len", "16", "--microbatches", "1", "--batch-size", "2", "--time-scale", "0",
          "--run-dir", "none", "--json"]
STEPS = {"moments": 12, "onebit": 8}
WARMUP = 2
FLAGS = {"moments": ["--steps", str(STEPS["moments"]), "--sync-every", "4", "--sync-moments", "--dp-codec",
                     "int8-block"],
         "onebit": ["--steps", str(STEPS["onebit"]), "--optimizer", "onebit-adam", "--onebit-warmup-steps",
                    str(WARMUP)]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """Each case's elastic and plain JSON reports ({case: {"elastic": ..., "plain": ...}})."""
    tmp = tmp_path_factory.mktemp("side-by-side")
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"stages": 1, "replicas": 2, "assignment": [[0, 1]]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    base = {case: ["train", "--cluster", CLUSTER, "--plan", str(plan), *COMMON, *flags]
            for case, flags in FLAGS.items()}
    # the default heartbeat timeout (10 s): nothing is killed here, and a loaded CI host once paused a group's
    # heartbeats past 1.5 s, so step 0's quorum formed without it (contributors 0.5, not 2)
    sides = {"elastic": [[*words, "--elastic"] for words in base.values()], "plain": list(base.values())}
    processes = [OneInterpreter(commands, tmp, side, env) for side, commands in sides.items()]
    reports = {case: {} for case in FLAGS}
    for side, done in zip(sides, results_of(processes), strict=True):
        for case, result in zip(FLAGS, done, strict=True):
            assert result.returncode == 0, f"{case} {side}: exit {result.returncode}\n{result.stderr[-3000:]}"
            reports[case][side] = json.loads(result.stdout)
    return reports


def test_an_elastic_moment_sync_run_trains_the_non_elastic_runs_numbers(runs):
    elastic, plain = runs["moments"]["elastic"], runs["moments"]["plain"]
    assert elastic["summary"]["steps"] == STEPS["moments"]
    assert elastic["summary"]["max_param_diff_across_replicas"] == 0.0
    # the same exchanges of the same numbers on the same codecs, summed in the same order: bit for bit
    assert elastic["losses"] == plain["losses"]


def test_an_elastic_onebit_adam_run_trains_the_non_elastic_runs_numbers(runs):
    elastic, plain = runs["onebit"]["elastic"], runs["onebit"]["plain"]
    steps = STEPS["onebit"]
    assert elastic["summary"]["steps"] == steps and elastic["summary"]["max_param_diff_across_replicas"] == 0.0
    assert elastic["losses"] == plain["losses"]
    # the non-elastic run's bytes (the fp32 gradient, then its (R + 1) 1-bit messages: ~21x less) and the weight
    plain_bytes = [iteration["dp_bytes"] for iteration in plain["iterations"]]
    assert len(set(plain_bytes[WARMUP:])) == 1 and plain_bytes[-1] < plain_bytes[0] / 20
    for records in elastic["group_records"].values():
        assert [r["contributors"] for r in records] == [2.0] * steps
        assert [r["dp_bytes"] for r in records] == [b + 4 * (step >= WARMUP) for step, b in enumerate(plain_bytes)]
