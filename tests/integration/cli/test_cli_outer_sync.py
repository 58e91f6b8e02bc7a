"""`geotrain train --outer-sync async|async-hierarchical`: a run through the runtime ends on every rank
with one final model (one validation loss), and settings it does not combine with are refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from geotrain.runtime import checkpoint as ckpt
from paths import ROOT

GEOTRAIN = (sys.executable, "-m", "geotrain")
CLUSTER = str(ROOT / "examples" / "clusters" / "mixed-gpus-3x2.yaml")


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> str:
    """One plan for the module's launches (a read-only input: the same file for every test)."""
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    done = subprocess.run([*GEOTRAIN, "plan", "--cluster", CLUSTER, "--stages", "1", "--replicas", "4", "--out",
                           str(out)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return str(out)


@pytest.mark.slow  # a 4-rank launch
@pytest.mark.timeout(400)
def test_async_hierarchical_train_of_two_stages_ends_with_one_model_on_every_rank(tmp_path):
    """2 stages x 2 replicas (replica 0 in oregon, replica 1 in virginia) on emulated links: each stage's global model
    has its servers (a region server per region of that stage's ranks, the global one on replica 0's rank of it), and
    stage 1's servers serve in the order stage 0's decide (sync/async_timing.py: replicas of several positions), so
    both stages' servers end in one state: one whole-model server, split by stage. In 2 fragments (each server a
    server per fragment, each region merging its fragments in turn: sync/async_fragments.py), so every fragment's
    server of a stage ends as the other stage's."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"method": "manual", "stages": 2, "replicas": 2, "assignment": [[0, 2], [1, 3]]}))
    done = subprocess.run([*GEOTRAIN, "train", "--run-dir", "none", "--cluster", CLUSTER, "--plan", str(plan),
                           "--steps", "10", "--sync-every", "5", "--time-scale", "0.05", "--outer-sync",
                           "async-hierarchical", "--fragments", "2", "--eval-every", "10", "--checkpoint-dir",
                           str(tmp_path / "ckpt"),
                           "--json"], capture_output=True, text=True, timeout=360)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["stages"] == 2
    # each rank evaluates once, after the final exchange, at whatever step it ended: one loss for all
    assert len({entry["loss"] for entry in report["validation"]}) == 1
    assert report["validation"][0]["step"] >= 5
    states = [torch.load(ckpt.shard_path(tmp_path / "ckpt", 10, rank), weights_only=True)["dp"]["asynchronous"]
              for rank in range(4)]  # rank = stage x 2 + replica
    for first, second in ((states[0], states[2]), (states[1], states[3])):  # replica 0's ranks, replica 1's
        for key in ("server", "region"):
            if key in first:
                mine, theirs = (_order_facts(s[key].get("server", s[key])) for s in (first, second))
                assert mine == theirs, key
    assert "server" in states[0] and "server" in states[2] and "region" in states[1] and "region" in states[3]
    assert len(states[0]["server"]["fragments"]) == 2 and all(len(state["versions"]) == 2 for state in states)


def _order_facts(server: dict) -> tuple:
    """What a server's state says of the requests it took, by its clients' order (not their ranks); per fragment."""
    if "fragments" in server:
        return tuple(_order_facts(part) for part in server["fragments"])
    return (server["version"], server["updates"], server["max_staleness"], server["discarded"],
            [n for _, n in server["applied"]], [b for _, b in server["base"]])


@pytest.mark.timeout(200)
@pytest.mark.parametrize("extra,why", [
    (["--outer-sync", "async-hierarchical", "--sync-delay", "1"],
     "--outer-sync async-hierarchical with --sync-delay 1: asynchronous outer updates send a replica's outer gradient "
     "(per stage, shard and fragment) at its own pace: a replica never waits for the exchange (no delay to set)")])
def test_settings_async_does_not_combine_with_are_refused_in_one_line(plan: str, extra, why):
    done = subprocess.run([*GEOTRAIN, "train", "--run-dir", "none", "--cluster", CLUSTER, "--plan", plan, "--steps",
                           "10", "--sync-every", "5", "--outer-sync", "async", *extra], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == f"geotrain: error: {why}"
