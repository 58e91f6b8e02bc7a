"""geotrain.bench.hetero's scoring on hand-made records: evaluation points timed by the slowest rank at the step
(or outer sync) they follow, site compute fractions, and the limit row's speed-balanced step time."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.bench.hetero import DEFAULT_ROWS, KINDS, HeteroRow, balanced_limit, score, with_rows
from geotrain.bench.wan_rows import WanBenchError
from geotrain.cluster import Cluster


def _cluster() -> Cluster:
    n = 2
    return Cluster(name="two", device_names=("a0", "b0"), region_names=("fast", "slow"), region_of=np.array([0, 1]),
                   bandwidth_gbps=np.full((n, n), 1.0), latency_ms=np.zeros((n, n)), gpus=("A100", "T4"))


def _record(rank: int, step: int, start: float, end: float, compute: float, val: float | None = None,
            **extra: object) -> dict:
    return {"rank": rank, "step": step, "compute_s": compute, "val_loss": val,
            "emulated": {"start_s": start, "end_s": end, "inter_region_bytes": 10}, **extra}


def test_adaptive_points_are_timed_at_the_sync_each_rank_reached_after_its_own_steps():
    # rank 0 takes 3 steps of 1 s, rank 1 one step of 3 s, then both sync (outer_step 1) at 3 s
    records = [_record(0, s, s, s + 1, 1.0, 2.5 if s == 2 else None, outer_step=1 if s == 2 else 0) for s in range(3)]
    records.append(_record(1, 0, 0.0, 3.2, 3.0, 2.5, outer_step=1))
    result = score(HeteroRow("diloco-adaptive", "x"), _cluster(), records, 2.4)
    assert result.eval_time_s == [pytest.approx(3.2)] and result.val_losses == [2.5]
    assert result.site_compute_fraction == {"fast": pytest.approx(3 / 3.2), "slow": pytest.approx(3 / 3.2)}
    assert result.inner_steps == {"fast": 3, "slow": 1}
    assert result.inter_region_bytes == 40
    assert result.time_to_target(2.5) == pytest.approx(3.2) and result.time_to_target(2.0) is None


def test_async_points_are_the_first_global_model_of_each_period_s_worth_of_updates_at_the_model_s_time():
    # two replicas: a point per 2 updates. rank 0 (fast) scores the models its server sent at 0.9 s (1 update),
    # 1.9 s (3) and 2.5 s (4); rank 1 (slow, a 0.4 s link away) the model sent at 1.1 s (2), which reached it at 1.5 s
    records = [_record(0, 0, 0.0, 1.0, 0.9, 2.6, global_updates=1, global_time_s=0.9),
               _record(0, 1, 1.0, 2.0, 0.9, 2.4, global_updates=3, global_time_s=1.9),
               _record(0, 2, 2.0, 2.6, 0.5, 2.45, global_updates=4, global_time_s=2.5),
               _record(1, 0, 0.0, 1.5, 1.4, 2.5, global_updates=2, global_time_s=1.1)]
    result = score(HeteroRow("async", "x"), _cluster(), records, 2.45)
    # 2 updates: rank 1's point (the slow rank's counts: it scored the global model); 3 updates skipped (the model
    # with 2 already stood for that period); 4 updates: rank 0's last, also the final model
    assert result.eval_time_s == [1.1, 2.5] and result.val_losses == [2.5, 2.45]
    assert result.time_to_target(2.5) == 1.1
    assert result.inner_steps == {"fast": 3, "slow": 1}


def test_limit_row_takes_the_harmonic_mean_of_the_ranks_compute_per_step():
    # compute 1 s and 3 s per step; balanced by speed both finish in 2 / (1 + 1/3) = 1.5 s; 0.1 s outside compute
    records = [_record(r, s, 3.1 * s, 3.1 * s + 3.1, 1.0 if r == 0 else 3.0, 2.0 if r == 0 and s == 1 else None)
               for r in range(2) for s in range(2)]
    result = balanced_limit(HeteroRow("limit", "limit", limit=True), _cluster(), records, 2.0, 2)
    assert result.eval_time_s == [pytest.approx(3.2)]
    assert result.site_compute_fraction["slow"] == pytest.approx(3.0 / 3.2)
    assert result.inter_region_bytes == 40  # the run's bytes, carried at no cost


def test_rows_are_one_entry_per_kind_and_unknown_kinds_are_refused():
    assert {row.kind for row in DEFAULT_ROWS} <= set(KINDS)
    assert [row.kind for row in with_rows("diloco-adaptive")] == ["diloco-adaptive", "limit"]
    with pytest.raises(WanBenchError, match="kinds among"):
        with_rows("fastest")
    with pytest.raises(WanBenchError, match="kind must be one of"):
        HeteroRow("quick", "x")
