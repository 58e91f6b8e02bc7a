"""Batch shares in the cost model: the split, the per-step prediction, and the choice against the WAN recipe."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import load_cluster
from geotrain.cost.batch_shares import (BatchSharesError, choose_shares, heterogeneous, predict_shares,
                                        rebalanced_samples, replica_speeds, share_samples, split_by_weights)
from paths import ROOT

MIXED = load_cluster(str(ROOT / "examples" / "clusters" / "mixed-gpus-3x2.yaml"))  # A100, V100, T4 x 2
ONE_PER_SITE = np.array([[0, 2, 4]])


def test_speed_shares_follow_the_peaks_and_keep_the_global_batch():
    assert list(replica_speeds(MIXED, ONE_PER_SITE)) == [312e12, 125e12, 65e12]
    assert share_samples("speed", MIXED, ONE_PER_SITE, 8) == (15, 6, 3)  # 24 x (312, 125, 65) / 502
    assert share_samples("equal", MIXED, ONE_PER_SITE, 8) == (8, 8, 8)
    assert share_samples((1.0, 1.0, 2.0), MIXED, ONE_PER_SITE, 4, unit=2) == (4, 2, 6)
    pipeline = np.array([[0, 1], [4, 2]])  # replica 0 paced by a T4, replica 1 by a V100
    assert list(replica_speeds(MIXED, pipeline)) == [65e12, 125e12]
    assert heterogeneous(MIXED, ONE_PER_SITE) and not heterogeneous(MIXED, np.array([[0, 1]]))


def test_prediction_scales_each_replicas_compute_by_its_speed_and_samples():
    equal = predict_shares(MIXED, ONE_PER_SITE, (8, 8, 8), compute_s=0.65, comm_s=0.1)
    assert equal.compute_s == pytest.approx((0.65 * 65 / 312, 0.65 * 65 / 125, 0.65))
    assert equal.step_s == pytest.approx(0.75)
    assert equal.compute_fraction == pytest.approx((0.65 * 65 / 312 / 0.75, 0.65 * 65 / 125 / 0.75, 0.65 / 0.75))
    speed = predict_shares(MIXED, ONE_PER_SITE, (15, 6, 3), compute_s=0.65, comm_s=0.1)
    assert speed.compute_s == pytest.approx((0.65 * 65 / 312 * 15 / 8, 0.65 * 65 / 125 * 6 / 8, 0.65 * 3 / 8))
    assert max(speed.compute_s) / min(speed.compute_s) < 1.05  # balanced: within the rounding of 24 samples


def test_shares_win_when_compute_outweighs_the_per_step_exchange_and_the_recipe_otherwise():
    # a recipe that hides its syncs runs at the slowest replica's compute; shares pay the exchange every step
    compute_bound = choose_shares(MIXED, ONE_PER_SITE, 24, compute_s=2.0, comm_s=0.3, recipe_step_s=2.0)
    assert compute_bound.chosen == "batch_shares" and compute_bound.step_s == pytest.approx(
        max(2.0 * 65 / 312 * 15 / 8, 2.0 * 65 / 125 * 6 / 8, 2.0 * 3 / 8) + 0.3)
    link_bound = choose_shares(MIXED, ONE_PER_SITE, 24, compute_s=0.1, comm_s=0.3, recipe_step_s=0.11)
    assert link_bound.chosen == "wan_recipe"
    assert link_bound.compute_fraction == pytest.approx((0.1 * 65 / 312 / 0.11, 0.1 * 65 / 125 / 0.11, 0.1 / 0.11))
    document = compute_bound.to_json(["a", "b", "c"])
    assert document["chosen"] == "batch_shares" and set(document["site_compute_fraction"]) == {"a", "b", "c"}
    with pytest.raises(BatchSharesError, match="not a multiple of 3 replicas"):
        choose_shares(MIXED, ONE_PER_SITE, 25, 1.0, 0.1, 1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=1, max_size=8), st.integers(1, 4),
       st.integers(1, 16))
def test_split_by_weights_keeps_the_global_batch_in_whole_micro_batches(weights, unit, per_replica):
    total = len(weights) * per_replica * unit
    shares = split_by_weights(weights, total, unit)
    assert sum(shares) == total
    assert all(s >= unit and s % unit == 0 for s in shares)
    ideal = np.asarray(weights) / sum(weights) * total
    lifted = int(np.sum(ideal < unit))  # replicas the floor of one unit lifted: the others paid for them
    assert all(abs(s - i) < unit * (1 + lifted) for s, i in zip(shares, ideal))
    if not lifted:  # largest remainder: within one unit of the ideal
        assert all(abs(s - i) < unit for s, i in zip(shares, ideal))


def test_split_by_weights_refuses_a_batch_too_small_for_every_replica():
    with pytest.raises(BatchSharesError, match="at least 4 samples"):
        split_by_weights([1, 1, 1], 8, 4)


def test_rebalancing_from_measured_compute_converges_where_a_part_does_not_grow_with_the_batch():
    # c_r = a_r + b_r n_r: a fixed part (optimizer, overheads) scaled by the device, as --emulate-gpu-speed does
    slow = np.array([1.0, 312 / 125, 312 / 65])
    fixed, per_sample = 0.02 * slow, 0.005 * slow
    samples = share_samples("speed", MIXED, ONE_PER_SITE, 16)  # 48 sequences
    assert samples == (30, 12, 6)
    for _ in range(6):
        samples = rebalanced_samples(samples, fixed + per_sample * np.array(samples))
    compute = fixed + per_sample * np.array(samples)
    assert sum(samples) == 48 and samples[2] < 6  # the T4's fixed part leaves it fewer than speed gives
    # balanced to the rounding: one sample more or less on any replica would not lower the slowest
    assert compute.max() - compute.min() <= per_sample.max() + 1e-12
    assert rebalanced_samples((8, 8), (0.0, 0.0)) == (8, 8)  # nothing measured: unchanged
