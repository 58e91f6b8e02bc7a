"""`train --local-steps adaptive` on a plan of 2 pipeline stages: a replica is its whole group of stages. Replica 0
runs stage 0 on an A100 and stage 1 on a T4, replica 1 both stages on L4s. Every rank of a replica agrees on its
step times (the slowest stage's, in a group of the replica's ranks) before the replicas share each period, so both
stages of a replica take the same inner steps, and the L4 replica more than the T4-paced one. Without the agreement,
stage 0's replicas would share by A100 against L4 and stage 1's by T4 against L4: each replica's stages would take
different step counts, and its pipeline would deadlock. One launch."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig, launch
from geotrain.runtime import checkpoint as ckpt

CLUSTER_YAML = """name: two-sites-of-two
defaults:
  intra: {gbps: 100, ms: 0.1}
regions:
  - {name: fast, devices: 1, gpu: A100}
  - {name: slow, devices: 1, gpu: T4}
  - {name: mid, devices: 2, gpu: L4}
links:
  - {between: [fast, slow], gbps: 1.0, ms: 20}
  - {between: [fast, mid], gbps: 1.0, ms: 20}
  - {between: [slow, mid], gbps: 1.0, ms: 20}
"""
STEPS, EVERY = 9, 3


@pytest.mark.timeout(300)
def test_each_replica_of_two_stages_takes_one_step_count_per_period_by_its_slowest_stage(tmp_path):
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    cluster = load_cluster(str(tmp_path / "cluster.yaml"))
    # stage s of replica r on device assignment[s][r]: replica 0 on the A100 and the T4, replica 1 on the L4s
    config = RuntimeConfig.of(cluster, np.array([[0, 2], [1, 3]]), steps=STEPS, sync_every=EVERY,
                              local_steps="adaptive", emulate_gpu_speed=True, time_scale=1e-3,
                              checkpoint_dir=str(tmp_path / "ckpt"), batch_size=2, microbatches=2)
    result = launch(config)
    assert result.exit_code == 0 and result.report.replicas_in_sync
    manifest = ckpt.read_manifest(tmp_path / "ckpt", STEPS)
    records = {}
    for rank in range(4):
        slot = config.layout.slot(rank)
        records[slot.stage, slot.replica] = ckpt.load_shard(tmp_path / "ckpt", STEPS, rank, manifest, {
            "rank": rank, "stage": slot.stage, "replica": slot.replica})["records"]
    periods = STEPS // EVERY
    for replica in range(2):  # the stages of a replica: one schedule
        assert [r["local_steps"] for r in records[0, replica]] == [r["local_steps"] for r in records[1, replica]]
    for period in range(periods):
        taken = [_periods(records[0, replica]).count(period) for replica in range(2)]
        assert sum(taken) == 2 * EVERY  # R x H steps
        if period == 0:  # the prior (each replica's slowest GPU): more on the L4s than the T4-paced replica; later
            assert taken[1] > taken[0]  # periods share by measured step times, which a loaded host can even out
        for stage in range(2):  # each stage's replicas hold the same anchor after the sync
            assert len({_last_of(records[stage, replica], period + 1)["param_sum"] for replica in range(2)}) == 1
    losses = [r["loss"] for r in records[1, 1]]  # the last stage's, on the L4 replica
    assert all(np.isfinite(losses)) and np.mean(losses[-3:]) < losses[0]


def _periods(records: list[dict]) -> list[int]:
    """The period of each step: the syncs done before it (the previous record's outer_step)."""
    return [0] + [r["outer_step"] for r in records[:-1]]


def _last_of(records: list[dict], outer_step: int) -> dict:
    """The record of the step that completed sync `outer_step` (the first record at that outer step)."""
    return next(r for r in records if r["outer_step"] == outer_step)
