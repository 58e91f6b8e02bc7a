"""An elastic run's checkpoint: which group writes (exactly one per committed quorum), when, and that what
it writes is the non-elastic format of one replica holding the global batch (runtime/elastic/checkpoint.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig
from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime import replan
from geotrain.runtime.elastic.checkpoint import (checkpoint_due, checkpoint_identity, load_group_checkpoint,
                                                 restore_group_state, save_group_checkpoint, writes_checkpoint)
from geotrain.sync.elastic import ManagerExchange, make_elastic_sync
from paths import ROOT

CLUSTER = load_cluster(str(ROOT / "tests" / "data" / "wan-2x2.yaml"))
ELASTIC = {"elastic": True, "time_scale": 0.0}


def _quorum_ranks(live_groups: tuple[int, ...]) -> dict[int, int]:
    """torchft's participating ranks of a quorum: the members' replica ids in sorted order (not group order)."""
    ids = sorted(f"geotrain_group_{g}" for g in live_groups)
    return {g: ids.index(f"geotrain_group_{g}") for g in live_groups}


def test_every_quorum_of_live_groups_has_exactly_one_writer_and_a_non_member_never_writes():
    groups = range(12)  # 12 groups: "geotrain_group_10" sorts before "geotrain_group_2"
    for size in (1, 2, 3, 12):
        for live in itertools.combinations(groups, size):
            writers = [g for g, rank in _quorum_ranks(live).items() if writes_checkpoint(rank)]
            assert len(writers) == 1, live
    assert not writes_checkpoint(None)  # not a participant of the step's quorum
    assert [g for g, r in _quorum_ranks((2, 10, 11)).items() if writes_checkpoint(r)] == [10]


def test_checkpoints_are_due_every_k_committed_steps_and_at_the_end_and_only_after_a_sync(tmp_path):
    config = RuntimeConfig.of(CLUSTER, [[0, 1]], **ELASTIC, steps=10, checkpoint_dir=str(tmp_path), checkpoint_every=4)
    assert [c for c in range(1, 11) if checkpoint_due(config, c, synced=True)] == [4, 8, 10]
    assert not checkpoint_due(config, 8, synced=False)  # mid outer round (--sync-every): no common state
    plain = RuntimeConfig.of(CLUSTER, [[0, 1]], **ELASTIC, steps=10)
    assert not any(checkpoint_due(plain, c, synced=True) for c in range(1, 11))  # no --checkpoint-dir


def _stage(config: RuntimeConfig) -> tuple[torch.nn.Module, object]:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    params = list(module.parameters())
    exchange = ManagerExchange(params, manager=None, healed=lambda: False, start_quorum=lambda: None)
    return module, make_elastic_sync(config.sync_options(0), params, exchange)


def test_the_writer_writes_one_copy_that_the_non_elastic_resume_reads_as_one_replica_of_the_global_batch(tmp_path):
    config = RuntimeConfig.of(CLUSTER, [[0, 3]], **ELASTIC, steps=10, batch_size=2, microbatches=1, checkpoint_dir=str(tmp_path),
                              checkpoint_every=4)
    module, sync = _stage(config)
    module(torch.ones(2, 4)).sum().backward()
    sync.optimizer.step()  # AdamW moments to carry
    save_group_checkpoint(config, 1, 0, 4, module, sync, (0, 2))

    assert ckpt.latest_step(tmp_path) == 4
    manifest = ckpt.read_manifest(tmp_path, 4)
    assert manifest["world_size"] == 1 and len(manifest["shards"]) == 1
    assert manifest["identity"] == checkpoint_identity(config)
    assert (manifest["identity"]["replicas"], manifest["identity"]["batch_size"]) == (1, 4)
    assert manifest["written_by"] == {"elastic_groups": 2, "group": 1, "group_batch_size": 2}
    # a non-elastic R' = 2 run of the same global batch (2 x 2) resumes it: both replicas load the one copy
    resumed = RuntimeConfig.of(CLUSTER, [[0, 1]], steps=10, batch_size=2, microbatches=1, checkpoint_dir=str(tmp_path), resume=True)
    replan.check_resume_identity(manifest, resumed.identity(), "test")
    assert replan.source_slot(manifest, 0, 1) == {"rank": 0, "stage": 0, "replica": 0}
    for other, words in (({"seed": 1}, "different run: seed is 0 there, 1 now"),
                         ({"batch_size": 1}, "global batch is 4 sequences .* pass --batch-size 2$")):
        settings = {"steps": 10, "batch_size": 2, "microbatches": 1, **other}
        with pytest.raises(ckpt.CheckpointError, match=words):
            replan.check_resume_identity(manifest, RuntimeConfig.of(CLUSTER, [[0, 1]], **settings).identity(), "t")
    with pytest.raises(ckpt.CheckpointError, match="the checkpoint has S = 1 pipeline stages, this plan S = 2"):
        replan.check_resume_identity(manifest, RuntimeConfig.of(CLUSTER, [[0], [1]], steps=10, batch_size=4,
                                                                microbatches=1).identity(), "t")
    shard = ckpt.load_shard(tmp_path, 4, 0, manifest, replan.source_slot(manifest, 0, 1))
    assert shard["assignment"] == [[3]] and shard["boundaries"] == [0, 2] and shard["completed"] == 4
    assert shard["records"] == [] and set(shard["stage"]) == {f"0.{k}" for k in module.state_dict()}
    assert shard["dp"]["exchange"]["reducer"]["codec"] == "none"  # what an uncompressed StageExchange loads
    assert len(shard["dp"]["optimizer"]["state"]) == len(list(module.parameters()))

    # --elastic --resume: a fresh group stage continues at step 4 with the writer's weights and moments
    other, other_sync = _stage(config)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    elastic = RuntimeConfig.of(CLUSTER, [[0, 1]], **ELASTIC, steps=10, batch_size=2, microbatches=1, checkpoint_dir=str(tmp_path),
                               resume=True)
    assert restore_group_state(load_group_checkpoint(elastic, 0), other, other_sync, str(tmp_path)) == 4
    for a, b in zip(module.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    moments = [s["exp_avg"] for s in other_sync.optimizer.state_dict()["state"].values()]
    assert all(torch.equal(m, s["exp_avg"]) for m, s in zip(moments, sync.optimizer.state_dict()["state"].values(),
                                                              strict=True))
