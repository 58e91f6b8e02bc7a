"""runtime.replan: which checkpoints a re-plan may continue (same S, same global batch, same run) and
which shard each of its slots loads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geotrain.cluster import make_network
from geotrain.data import replica_batch
from geotrain.runtime import RuntimeConfig
from geotrain.runtime.checkpoint import CheckpointError
from geotrain.runtime.replan import check_resume_identity, is_replan, layout_change, layout_free, source_slot

CLUSTER = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0, name="test-2x2")


def _manifest(assignment, **settings) -> dict:
    return {"identity": RuntimeConfig.of(CLUSTER, assignment, **settings).identity()}


def _identity(assignment, **settings) -> dict:
    return RuntimeConfig.of(CLUSTER, assignment, **settings).identity()


SAVED = _manifest([[0, 2], [1, 3]], batch_size=4, microbatches=2)  # 2 x 2, global batch 8


def test_a_replan_with_the_same_s_and_global_batch_is_the_same_run():
    check_resume_identity(SAVED, _identity([[0], [3]], batch_size=8, microbatches=2), "ckpt")  # R 2 -> 1
    check_resume_identity(SAVED, _identity([[3, 1], [0, 2]], batch_size=4, microbatches=2), "ckpt")  # re-mapped
    check_resume_identity(SAVED, SAVED["identity"], "ckpt")
    assert layout_free(SAVED["identity"])["global_batch"] == 8 and "replicas" not in layout_free(SAVED["identity"])


def test_another_s_is_refused_naming_both():
    with pytest.raises(CheckpointError, match=r"^ckpt: the checkpoint has S = 2 pipeline stages, this plan S = 1: a "
                                              r"re-plan must keep S \(re-splitting the layers from a checkpoint is not "
                                              r"supported; re-plan with --stages 2\)$"):
        check_resume_identity(SAVED, _identity([[0, 1]], batch_size=4, microbatches=2), "ckpt")


def test_another_global_batch_is_refused_naming_the_batch_size_that_keeps_it():
    with pytest.raises(CheckpointError, match=r"global batch is 8 sequences \(2 replicas x 4\), this plan's is 4 "
                                              r"\(1 x 4\); a re-plan keeps the global batch: pass --batch-size 8$"):
        check_resume_identity(SAVED, _identity([[0], [3]], batch_size=4, microbatches=2), "ckpt")
    three = _manifest([[0, 1, 2], [3, 0, 1]][:1], batch_size=2, microbatches=2)  # 1 x 3, global batch 6
    with pytest.raises(CheckpointError, match="6 does not split over 4 replicas: re-plan with a replica count"):
        check_resume_identity(three, _identity([[0, 1, 2, 3]], batch_size=2, microbatches=2), "ckpt")


def test_another_model_or_data_is_still_refused_by_name():
    with pytest.raises(CheckpointError, match=r"different run: data is \{'world': 0\} there, \{'world': 1\} now"):
        check_resume_identity(SAVED, _identity([[0], [3]], batch_size=8, microbatches=2, data_seed=1), "ckpt")
    with pytest.raises(CheckpointError, match="different run: lr is"):
        check_resume_identity(SAVED, _identity([[0], [3]], batch_size=8, microbatches=2, lr=1e-2), "ckpt")
    with pytest.raises(CheckpointError, match="different run: model is .*'spec': 'tiny'.* there, .*'tiny-2layer'"):
        check_resume_identity(SAVED, _identity([[0], [3]], batch_size=8, microbatches=2, model_name="tiny-2layer"),
                              "ckpt")


def test_each_slot_loads_its_stage_shard_of_replica_r_mod_the_old_r():
    assert [source_slot(SAVED, s, 0) for s in range(2)] == [{"rank": 0, "stage": 0, "replica": 0},
                                                            {"rank": 2, "stage": 1, "replica": 0}]
    assert source_slot(SAVED, 1, 1) == {"rank": 3, "stage": 1, "replica": 1}
    assert source_slot(SAVED, 1, 3) == {"rank": 3, "stage": 1, "replica": 1}  # grown: a copy of replica 1's
    old = [[0, 2], [1, 3]]
    assert is_replan(SAVED, {"assignment": old}, [[0], [3]])  # R 2 -> 1
    assert is_replan(SAVED, {"assignment": old}, [[2, 0], [1, 3]])  # same R, re-mapped
    assert not is_replan(SAVED, {"assignment": old}, old) and not is_replan(SAVED, {}, old)


def test_the_global_batch_of_a_step_is_the_same_windows_cut_in_r_slices():
    tokens = np.arange(5000) % 97
    for step in (0, 7):
        whole = replica_batch(tokens, 3, step, 0, 1, 8, 16)[0]
        halves = torch.cat([replica_batch(tokens, 3, step, r, 2, 8, 16)[0] for r in range(2)])
        quarters = torch.cat([replica_batch(tokens, 3, step, r, 4, 8, 16)[0] for r in range(4)])
        assert torch.equal(whole, halves) and torch.equal(whole, quarters)
    assert not torch.equal(replica_batch(tokens, 3, 0, 0, 1, 8, 16)[0], replica_batch(tokens, 3, 1, 0, 1, 8, 16)[0])


def test_layout_change_names_a_resume_on_other_devices_or_replicas_and_nothing_on_the_same_layout():
    manifest = {"identity": {"replicas": 2}}
    same = [[0, 2], [1, 3]]
    assert layout_change(manifest, {"assignment": same}, same) is None
    assert layout_change(manifest, {"assignment": same}, [[0], [1]]) == {
        "from_replicas": 2, "to_replicas": 1, "from_assignment": same, "to_assignment": [[0], [1]]}
    assert layout_change(manifest, {"assignment": same}, [[0, 3], [1, 2]])["from_replicas"] == 2  # devices moved
    # an elastic run's checkpoint (one copy, replicas 1): its groups are the replicas it ran with
    elastic = {"identity": {"replicas": 1}, "written_by": {"elastic_groups": 2}}
    assert layout_change(elastic, {"assignment": [[2]]}, [[0]])["from_replicas"] == 2
    assert layout_change(elastic, {"assignment": [[2]]}, [[0, 2]]) is None  # --elastic --resume on its plan


def test_a_sharded_checkpoint_resumes_on_its_k_alone_and_each_shard_loads_its_own_file():
    settings = {"batch_size": 4, "microbatches": 2, "sync_every": 4}
    sharded = _manifest([[0, 2]], shards=[[[0, 1], [2, 3]]], **settings)  # 1 x 2 x 2 shards, a site each
    check_resume_identity(sharded, sharded["identity"], "ckpt")
    with pytest.raises(CheckpointError, match=r"^ckpt: the checkpoint has K = 2 devices per slot \(FSDP2 shards\), "
                                              r"this plan K = 1: its shards are cut for its K \(resume with a plan of "
                                              r"K = 2, plan --shards\)$"):
        check_resume_identity(sharded, _identity([[0, 2]], **settings), "ckpt")
    with pytest.raises(CheckpointError, match=r"^ckpt: the checkpoint has K = 1 devices per slot .* this plan K = 2"):
        check_resume_identity(_manifest([[0, 2]], **settings), sharded["identity"], "ckpt")
    # ranks (s R + r) K + k: shard 1 of replica 1 is rank 3; a re-plan to R = 1 loads replica 0's same shard
    assert source_slot(sharded, 0, 1, 1) == {"rank": 3, "stage": 0, "replica": 1, "shard": 1}
    assert source_slot({"identity": {**sharded["identity"], "replicas": 1}}, 0, 1, 1) == {
        "rank": 1, "stage": 0, "replica": 0, "shard": 1}
