"""Sharded replicas in the planner (cost/shards.py): slots, the slot cluster, memory under K shards, and the
vectorised "yuan+compute" / "schedule" held to the plain-loop reference."""

import numpy as np
import pytest

from geotrain.cluster.io import parse_cluster_text
from geotrain.cost.compute import YuanComputeCostModel
from geotrain.cost.memory import MemoryConfig, stage_memory_bytes
from geotrain.cost.reference import sharded_compute_reference
from geotrain.cost.schedule import ScheduleCostModel
from geotrain.cost.shards import ShardError, Sharding, check_slots, group_slots, slot_view
from geotrain.job import Job

CLUSTER = """name: mixed-2x4
regions:
  - {name: oregon, devices: 4, gpu: [A100, A100, V100, V100], intra: {gbps: 100, ms: 0.05}}
  - {name: tokyo, devices: 4, gpu: A100, intra: {gbps: 50, ms: 0.2}}
links:
  - {between: [oregon, tokyo], gbps: 0.8, ms: 60}
"""
JOB = Job(name="j", params=1.3e9, seq_len=1024, hidden=2048, global_batch=64, layers=8)


@pytest.fixture(scope="module")
def cluster():
    return parse_cluster_text(CLUSTER, "mixed-2x4")


def test_slots_are_one_sites_devices_fastest_first(cluster):
    assert group_slots(cluster, 2).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert group_slots(cluster, 3).tolist() == [[0, 1, 2], [4, 5, 6]]  # a site's last n mod K are left out
    with pytest.raises(ShardError, match="spans sites oregon, tokyo"):
        check_slots(cluster, np.array([[0, 4]]))
    with pytest.raises(ShardError, match="used in slots 0 and 1"):
        check_slots(cluster, np.array([[0, 1], [1, 2]]))


def test_the_slot_cluster_runs_k_same_shard_exchanges_at_once(cluster):
    slots, sharding, assignment = slot_view(cluster, np.array([[[2, 3], [4, 5]]]))
    assert slots.gpus == ("V100", "A100")  # a slot is as fast as its slowest device
    assert slots.bandwidth_gbps[0, 1] == pytest.approx(2 * 0.8)
    assert slots.latency_ms[0, 1] == pytest.approx(60.0)
    assert assignment.tolist() == [[0, 1]]
    assert sharding.intra_s["tokyo"] == pytest.approx((0.2e-3, 50e9))
    # 3 rings (2 all-gathers + 1 reduce-scatter) of 1 GB over 2 devices: 3 x (a + 8e9 / 2 / b)
    assert sharding.fsdp_seconds(slots, 1e9).tolist() == pytest.approx(
        [3 * (0.05e-3 + 4e9 / 100e9), 3 * (0.2e-3 + 4e9 / 50e9)])


def test_memory_under_k_shards_by_hand():
    job = Job(name="m", params=1e9 + 1000 * 100, seq_len=10, hidden=100, global_batch=8, layers=10, vocab=1000)
    got = stage_memory_bytes(job, 2, 1, 2, MemoryConfig(), shards=4)
    states = (5e8 + 1e5) * 16 / 4  # each stage: 5 layers of 1e8 + the (tied) embedding, over 4 shards
    gathered = 2 * 4 * 1e8  # two layers' 16-bit weights and gradients unsharded at once
    acts = 34 * 10 * 1 * 100 * 5  # 1 sequence per device (8 / (R=1 x M=2 x K=4)), 5 layers
    assert got.tolist() == pytest.approx([states + gathered + 2 * acts,  # 1F1B: 2 in flight at stage 0
                                          states + gathered + acts + 4 * 10 * 1 * 1000])  # + fp32 logits
    outer = stage_memory_bytes(job, 2, 1, 2, MemoryConfig(state_bytes_per_param=24.0), shards=4)
    assert (outer - got).tolist() == pytest.approx([(5e8 + 1e5) * 8 / 4] * 2)  # DiLoCo's outer state / K too
    assert stage_memory_bytes(job, 2, 1, 2, MemoryConfig(), shards=1)[0] == pytest.approx(
        (5e8 + 1e5) * 16 + 2 * 5 * 34 * 10 * 4 * 100)  # K = 1: as before (4 sequences per micro-batch)


@pytest.mark.parametrize("devices", [
    [[[0, 1], [4, 5]], [[2, 3], [6, 7]]],  # 2 stages x 2 replicas x 2 shards, replicas across sites
    [[[0, 1, 2, 3]], [[4, 5, 6, 7]]],  # 2 stages (one per site) x 1 replica x 4 shards
    [[[2, 3], [0, 1], [6, 7], [4, 5]]],  # 1 stage x 4 replicas
])
def test_sharded_yuan_compute_matches_the_plain_loop_reference(cluster, devices):
    devices = np.array(devices)
    stages, replicas, _ = devices.shape
    slots, sharding, assignment = slot_view(cluster, devices)
    model = YuanComputeCostModel.for_job(slots, JOB, stages, replicas, micro_batches=4, utilisation=0.5,
                                         sharding=sharding)
    cost = model.evaluate(assignment)
    reference = sharded_compute_reference(cluster, JOB, devices.tolist(), micro_batches=4, utilisation=0.5)
    assert {**cost.to_json()} == pytest.approx(reference, rel=1e-12)


def test_k_equal_one_changes_nothing(cluster):
    plain = ScheduleCostModel.for_job(cluster, JOB, 2, 2, micro_batches=4)
    slots, sharding, assignment = slot_view(cluster, np.array([[[0], [4]], [[1], [5]]]))
    sharded = ScheduleCostModel.for_job(slots, JOB, 2, 2, micro_batches=4, sharding=sharding)
    assert sharded.evaluate(assignment).total == pytest.approx(plain.evaluate(np.array([[0, 4], [1, 5]])).total)
    assert Sharding().fsdp_seconds(slots, 1e9).tolist() == [0.0] * 4


def test_schedule_with_shards_computes_over_k_and_pays_fsdp_inside_the_slot(cluster):
    devices = np.array([[[4, 5, 6, 7]]])
    slots, sharding, assignment = slot_view(cluster, devices)
    cost = ScheduleCostModel.for_job(slots, JOB, 1, 1, micro_batches=4, utilisation=0.5,
                                     sharding=sharding).evaluate(assignment)
    compute = JOB.flops_per_iteration() / 4 / (312e12 * 0.5)
    stage_bytes = (JOB.params) * 2  # one stage: every layer and the embedding
    fsdp = 3 * 3 * (0.2e-3 + 8 * stage_bytes / 4 / 50e9)
    assert cost.total == pytest.approx(compute + fsdp, rel=1e-9)
