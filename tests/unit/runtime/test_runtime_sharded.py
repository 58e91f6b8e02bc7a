"""Sharded plans in the runtime without processes: the rank numbering (runtime/layout.py), the refusals of a
sharded plan (runtime/sharded.py and the composition table), and the process groups' backends on `--device cuda`
with CPU stand-ins (torch is told a GPU is there and new_group is recorded: the construction, not a GPU, is
tested; benchmarks/cuda/check.sh runs the sharded plan on a GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from geotrain.cli.run_line import what_runs
from geotrain.cluster.io import parse_cluster_text
from geotrain.comm.groups import PER_DEVICE_BACKEND, group_backend
from geotrain.runtime import worker as worker_module
from geotrain.runtime.config import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.dp_step import create_stage_hierarchies
from geotrain.runtime.layout import Layout, LayoutError
from runtime_2x2 import CLUSTER_YAML

CLUSTER = parse_cluster_text(CLUSTER_YAML)  # devices 0, 1 east; 2, 3 west
ASSIGNMENT, SHARDS = np.array([[0, 2]]), np.array([[[0, 1], [2, 3]]])
DILOCO = {"sync_every": 4, "time_scale": 0.0, "steps": 8}


def test_ranks_are_stage_then_replica_then_shard_and_groups_follow():
    layout = Layout(np.array([[0, 4], [2, 6]]), np.array([[[0, 1], [4, 5]], [[2, 3], [6, 7]]]))
    assert layout.world_size == 8 and layout.k == 2
    assert [(s.stage, s.replica, s.shard, s.device) for s in map(layout.slot, range(8))] == [
        (0, 0, 0, 0), (0, 0, 1, 1), (0, 1, 0, 4), (0, 1, 1, 5), (1, 0, 0, 2), (1, 0, 1, 3), (1, 1, 0, 6), (1, 1, 1, 7)]
    assert layout.rank_devices() == [0, 1, 4, 5, 2, 3, 6, 7]  # what emulate --plan and the emulator use
    assert layout.dp_group_ranks(1, shard=1) == [5, 7] and layout.dp_group_devices(1, shard=1) == [3, 7]
    assert layout.shard_group_ranks(0, 1) == [2, 3]
    assert layout.next_rank(3) == 7 and layout.prev_rank(7) == 3 and layout.prev_rank(3) is None
    assert layout.describe(5) == "rank 5 (stage 1, replica 0, shard 1, device 3)"
    unsharded = Layout(np.array([[0, 2], [1, 3]]))  # K = 1: the numbering it always had
    assert unsharded.world_size == 4 and unsharded.slot(3).device == 3 and unsharded.dp_group_ranks(1) == [2, 3]
    with pytest.raises(LayoutError, match="first device must be its device in the assignment"):
        Layout(ASSIGNMENT, np.array([[[1, 0], [2, 3]]]))


def test_a_sharded_plan_builds_and_counts_its_ranks():
    config = RuntimeConfig.of(CLUSTER, ASSIGNMENT, shards=SHARDS, **DILOCO)
    assert config.world_size == 4 and config.layout.k == 2 and config.identity()["shards"] == 2
    assert config.to_json()["shards_devices"] == SHARDS.tolist()
    assert what_runs(config).startswith("runs: 1 stage x 2 replicas x 2 shards (FSDP2 in a site) on test-2x2; ")


@pytest.mark.parametrize("shards, settings, message", [
    (SHARDS, {"sync_every": None}, r"^a plan of 2 devices per slot \(plan --shards\) runs DiLoCo per shard: give "
                                   r"--sync-every H \(per-step data parallelism across sharded slots is not built yet\)$"),
    (np.array([[[0, 2], [1, 3]]]), {}, r"^the plan's shards.devices: slot 0 spans sites east, west: a slot's K "
                                       r"devices must be in one site"),
    (SHARDS, {"batch_size": 6, "microbatches": 2}, r"^schedule.batch_size: each replica's 6 sequences must split "
                                                   r"into 2 shards of 2 micro-batches \(a multiple of 4\)$"),
])
def test_what_a_sharded_plan_cannot_run_is_refused_in_one_line(shards, settings, message):
    assignment = shards[..., 0]
    with pytest.raises(RuntimeConfigError, match=message) as refused:
        RuntimeConfig.of(CLUSTER, assignment, shards=shards, **{**DILOCO, **settings})
    assert "\n" not in str(refused.value)


def test_a_sharded_plans_region_hierarchy_holds_each_regions_same_shard_ranks(monkeypatch):
    """--dp-hierarchical on 4 sites x 2 shards, two sites per region: shard k's hierarchy is over shard k's peers
    (its regions: the region's same-shard ranks; its inter-region groups: one rank of each), created for every
    shard on every rank, in one order."""
    import geotrain.comm.hierarchical as hierarchical

    made = []
    monkeypatch.setattr(hierarchical, "new_group", lambda ranks, timeout_s: made.append(tuple(ranks)) or len(made))
    layout = Layout(np.array([[0, 2, 4, 6]]), np.array([[[0, 1], [2, 3], [4, 5], [6, 7]]]))  # rank 2 x site + shard
    region_of_device = [0, 0, 0, 0, 1, 1, 1, 1]
    hierarchies = create_stage_hierarchies(layout, region_of_device, timeout_s=7.0)
    assert [[h.regions.members for h in stage] for stage in hierarchies] == [[((0, 2), (4, 6)), ((1, 3), (5, 7))]]
    assert [sorted(h.inter) for h in hierarchies[0]] == [[(0, 4), (2, 6)], [(1, 5), (3, 7)]]
    assert made == [(0, 2), (4, 6), (0, 4), (2, 6), (1, 3), (5, 7), (1, 5), (3, 7)]


@pytest.mark.parametrize("device, dimension, sites, backend", [
    ("cpu", "world", 2, "gloo"), ("cpu", "shard", 1, None), ("cpu", "replicate", 2, None),
    ("cuda", "world", 2, PER_DEVICE_BACKEND), ("cuda", "shard", 1, "nccl"), ("cuda", "pipeline", 1, "nccl"),
    ("cuda", "pipeline", 2, PER_DEVICE_BACKEND), ("cuda", "replicate", 1, PER_DEVICE_BACKEND),
    ("cuda", "replicate", 2, PER_DEVICE_BACKEND),
    ("cuda", "replica", 1, PER_DEVICE_BACKEND)])  # a replica's ranks agree on host tensors: not NCCL alone
def test_the_backend_of_each_group_dimension(device, dimension, sites, backend):
    assert group_backend(device, dimension, sites) == backend


def test_an_unknown_group_dimension_is_refused():
    with pytest.raises(ValueError, match="group dimension must be one of world, replicate, shard, pipeline"):
        group_backend("cuda", "tensor", 1)


def test_a_sharded_cuda_run_makes_its_slot_groups_nccl_and_its_outer_sync_group_gloo_for_host_tensors(monkeypatch):
    """The groups a worker of a sharded 1 x 2 x 2 plan creates on --device cuda (Worker._group, every group's path):
    each slot's shard group inside its site on NCCL; the same-shard peers across the sites on the per-device string
    (the outer sync encodes host copies: gloo); the one-stage pipeline groups inside a site on NCCL."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = RuntimeConfig.of(CLUSTER, ASSIGNMENT, shards=SHARDS, device="cuda", **DILOCO)
    made = []
    monkeypatch.setattr(worker_module, "new_group", lambda ranks, timeout_s, backend: made.append(
        (tuple(ranks), timeout_s, backend)))
    stand_in = SimpleNamespace(config=config, layout=config.layout, timeout_s=7.0, device=torch.device("cuda", 0))
    layout = config.layout
    for stage, shard in np.ndindex(1, 2):
        worker_module.Worker._group(stand_in, layout.dp_group_ranks(stage, shard), "replicate")
    for replica in range(2):
        worker_module.Worker._group(stand_in, layout.shard_group_ranks(0, replica), "shard")
        worker_module.Worker._group(stand_in, [layout.rank_of(0, replica, 0)], "pipeline")
    assert made == [((0, 2), 7.0, PER_DEVICE_BACKEND), ((1, 3), 7.0, PER_DEVICE_BACKEND),
                    ((0, 1), 7.0, "nccl"), ((0,), 7.0, "nccl"), ((2, 3), 7.0, "nccl"), ((2,), 7.0, "nccl")]
