"""`train --sync-every H --local-steps adaptive` in the runtime: real processes over the emulating backend on two
sites of different GPUs (compute at each GPU's speed), one launch; every period shares R x H steps, the ranks end
together after the run's periods, and they agree on the anchor between the same syncs, blocking or with each sync
overlapped with the next period (a delay, eager landing); their first steps start together (worker.start_line).
With --sync-moments the inner AdamW's moments travel in the outer syncs (every one; with a delay the first only:
--moment-syncs 1), which carry three tensors per parameter instead of one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig, launch
from geotrain.runtime import checkpoint as ckpt
from two_gpus import TWO_GPUS_YAML


@pytest.mark.timeout(300)
@pytest.mark.parametrize("overlap", [
    {"sync_moments": True}, {"sync_delay": 1, "sync_landing": "eager", "sync_moments": True, "moment_syncs": 1}],
                         ids=["blocking-moments", "delay-1-eager-first-moments"])
def test_adaptive_ranks_share_each_period_and_end_together_in_sync(tmp_path, overlap):
    (tmp_path / "cluster.yaml").write_text(TWO_GPUS_YAML)
    cluster = load_cluster(str(tmp_path / "cluster.yaml"))
    steps, every = 9, 3
    config = RuntimeConfig.of(cluster, np.array([[0, 1]]), steps=steps, sync_every=every, local_steps="adaptive",
                              outer_lr=1.0, outer_momentum=0.0, emulate_gpu_speed=True, time_scale=1e-3,
                              checkpoint_dir=str(tmp_path / "ckpt"), batch_size=2, microbatches=1, **overlap)
    result = launch(config)
    assert result.exit_code == 0
    assert result.report.replicas_in_sync  # at the end: the last sync landed, every replica on the anchor
    manifest = ckpt.read_manifest(tmp_path / "ckpt", steps)
    records = {rank: ckpt.load_shard(tmp_path / "ckpt", steps, rank, manifest,
                                     {"rank": rank, "stage": 0, "replica": rank})["records"] for rank in range(2)}
    # the start line: the T4 rank's set-up, counted at its GPU's speed, does not start its first step late (without
    # it: ~0.4 s late); what it runs between the barrier and its first step counts at that speed too (a loaded
    # machine: ~10 ms)
    first = [records[rank][0]["emulated"]["start_s"] for rank in range(2)]
    assert first[1] == pytest.approx(first[0], abs=0.1)
    periods = steps // every
    for rank in range(2):
        assert records[rank][-1]["outer_step"] == periods
        assert [r["step"] for r in records[rank]] == list(range(len(records[rank])))
    # per period: the steps each rank took sum to R x H, and both hold the same anchor after its sync
    for period in range(periods):
        taken = [_periods(records[rank]).count(period) for rank in range(2)]
        assert sum(taken) == 2 * every
        assert taken == [_last_of(records[rank], period + 1)["local_steps"] for rank in range(2)]
        assert len({_last_of(records[rank], period + 1)["param_sum"] for rank in range(2)}) == 1
    assert sum(len(records[rank]) for rank in range(2)) == periods * 2 * every
    # every sync's bytes are in a record, the last one's (landed at the end) too: codec none, 4 bytes per value, and
    # a sync with the moments sends three values per parameter (outer gradient, first and second moment)
    shards = {rank: ckpt.load_shard(tmp_path / "ckpt", steps, rank, manifest,
                                    {"rank": rank, "stage": 0, "replica": rank}) for rank in range(2)}
    values = sum(t.numel() for t in shards[0]["stage"].values())
    with_moments = periods if overlap.get("moment_syncs") is None else overlap["moment_syncs"]
    for rank in range(2):
        assert sum(r["dp_bytes"] for r in records[rank]) == 4 * values * (3 * with_moments + periods - with_moments)
    if overlap.get("moment_syncs") is None:  # the last sync carried the moments and landed them: equal on both
        states = [shards[rank]["dp"]["optimizer"]["state"] for rank in range(2)]
        assert states[0].keys() == states[1].keys() and states[0]
        for key in states[0]:
            for moment in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(states[0][key][moment], states[1][key][moment])


def _periods(records: list[dict]) -> list[int]:
    """The period of each step: the syncs done before it (the previous record's outer_step)."""
    return [0] + [r["outer_step"] for r in records[:-1]]


def _last_of(records: list[dict], outer_step: int) -> dict:
    """The record of the step that completed sync `outer_step` (the first record at that outer step)."""
    return next(r for r in records if r["outer_step"] == outer_step)


@pytest.mark.timeout(300)
def test_adaptive_by_regions_each_region_one_replica_with_the_hierarchical_exchange(tmp_path):
    """--dp-hierarchical: two regions of two GPUs (A100s, T4s); each region is one replica: its members take the same
    steps and hold the same parameters at every step (their gradients averaged every step), the regions share each
    period's R x H steps by speed (the A100s more), and every rank holds the same anchor after each sync; each sync
    posted (the hierarchical exchange overlapped with a step of the next period, eager landing)."""
    two_each = TWO_GPUS_YAML.replace("devices: 1", "devices: 2, intra: {gbps: 100, ms: 0.1}")
    (tmp_path / "cluster.yaml").write_text(two_each)
    cluster = load_cluster(str(tmp_path / "cluster.yaml"))
    steps, every = 6, 3
    config = RuntimeConfig.of(cluster, np.array([[0, 1, 2, 3]]), steps=steps, sync_every=every, local_steps="adaptive",
                              outer_lr=1.0, outer_momentum=0.0, emulate_gpu_speed=True, time_scale=1e-3,
                              dp_hierarchical=True, dp_codec="int8-block", sync_delay=1, sync_landing="eager",
                              checkpoint_dir=str(tmp_path / "ckpt"), batch_size=2, microbatches=1)
    result = launch(config)
    assert result.exit_code == 0 and result.report.replicas_in_sync
    manifest = ckpt.read_manifest(tmp_path / "ckpt", steps)
    records = {rank: ckpt.load_shard(tmp_path / "ckpt", steps, rank, manifest,
                                     {"rank": rank, "stage": 0, "replica": rank})["records"] for rank in range(4)}
    for a, b in ((0, 1), (2, 3)):  # a region's members: one replica
        assert [r["param_sum"] for r in records[a]] == [r["param_sum"] for r in records[b]]
    periods = steps // every
    for period in range(periods):
        taken = [_periods(records[rank]).count(period) for rank in (0, 2)]
        assert sum(taken) == 2 * every
        assert len({_last_of(records[rank], period + 1)["param_sum"] for rank in range(4)}) == 1
    assert _periods(records[0]).count(periods - 1) > _periods(records[2]).count(periods - 1)  # A100s: more steps
