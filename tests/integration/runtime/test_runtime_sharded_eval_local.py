"""`train --eval-local` on a sharded plan (plan --shards 2: 2 sites x 2 shards): each slot's K ranks score every
validation window with the replica's weights (FSDP2 gathers them inside the site). At the end every replica holds
the anchor, so the local score equals the run's shared evaluation (windows dealt out to the replicas, summed over
them): both sum the same float32 window losses in float64, in another grouping (measured: 1.8e-7 apart here; the
bound 1e-5 is 2000x below the loss's fall over the run). Two launches side by side."""

from __future__ import annotations

import json
import os

import pytest

from one_interpreter import run_side_by_side
from paths import ROOT
from runtime_2x2 import CLUSTER_YAML

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SHARDED = {"method": "manual", "stages": 1, "replicas": 2, "assignment": [[0, 2]],
           "shards": {"k": 2, "devices": [[[0, 1], [2, 3]]]}}


def test_a_sharded_slot_scores_its_replica_locally_as_the_shared_evaluation_does(tmp_path):
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp_path / "plan.json").write_text(json.dumps(SHARDED))
    base = ["train", "--run-dir", "none", "--cluster", str(tmp_path / "cluster.yaml"),
            "--plan", str(tmp_path / "plan.json"), "--steps", "8", "--sync-every", "4", "--dp-codec", "int8-block",
            "--time-scale", "0", "--eval-every", "8", "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    out = run_side_by_side({"local": [*base, "--eval-local"], "shared": base}, tmp_path, env)
    local, shared = out["local"], out["shared"]
    assert local["losses"] == shared["losses"]  # the evaluation changes no training
    (last_local,), (last_shared,) = local["validation"], shared["validation"]
    assert last_local["step"] == last_shared["step"] == 8
    print("local - shared:", last_local["loss"] - last_shared["loss"])
    assert abs(last_local["loss"] - last_shared["loss"]) < 1e-5 and last_local["loss"] < local["losses"][0] - 0.02
