"""Batch shares: the split of the global batch (runtime/batch_shares.py) and its place in the config."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import load_cluster
from geotrain.data import world_tokens
from geotrain.cost.batch_shares import replica_speeds, split_by_weights
from geotrain.runtime.batch_shares import (BatchSharesError, batch_shares, gradient_factor, parse_batch_shares,
                                           share_offset)
from geotrain.runtime.config import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.training_data import load_training_data
from paths import ROOT

MIXED = ROOT / "examples" / "clusters" / "mixed-gpus-3x2.yaml"


def test_parse_batch_shares_takes_rules_and_weights():
    assert parse_batch_shares("equal") == "equal"
    assert parse_batch_shares(" speed ") == "speed"
    assert parse_batch_shares("1,2.5,3") == (1.0, 2.5, 3.0)


@pytest.mark.parametrize("text", ["", "fast", "1,,2", "1,0", "-1,2", "nan,1", "inf"])
def test_parse_batch_shares_refuses_in_one_line(text):
    with pytest.raises(BatchSharesError, match="equal, speed or weights") as info:
        parse_batch_shares(text)
    assert "\n" not in str(info.value)


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


def test_gradient_factors_make_the_mean_a_sample_weighted_mean():
    shares = (2, 3, 7)
    factors = [gradient_factor(shares, r) for r in range(3)]
    assert np.isclose(np.mean(factors), 1.0)
    assert [share_offset(shares, r) for r in range(3)] == [0, 2, 5]


def test_speed_shares_follow_the_gpu_peaks_of_the_mixed_cluster():
    cluster = load_cluster(str(MIXED))
    assignment = np.array([[0, 2, 4]])  # one device per site: A100, V100, T4
    speeds = replica_speeds(cluster, assignment)
    assert speeds[0] > speeds[1] > speeds[2]
    shares = batch_shares("speed", cluster, assignment, 8, 1)
    assert sum(shares) == 24 and shares[0] > shares[1] > shares[2]
    assert np.allclose(np.asarray(shares) / 24, speeds / speeds.sum(), atol=1 / 24)
    assert batch_shares("equal", cluster, assignment, 8, 2) == (8, 8, 8)
    with pytest.raises(BatchSharesError, match="2 weights for 3 replicas"):
        batch_shares((1.0, 2.0), cluster, assignment, 8, 1)


def test_shares_cover_the_global_batch_exactly_once():
    data = load_training_data(None, 3, 0.1, world_tokens(3))
    shares = (1, 5, 2)
    whole, _ = data.share(3, 4, 0, 8, 8, 16)
    parts = [data.share(3, 4, share_offset(shares, r), shares[r], 8, 16)[0] for r in range(3)]
    assert np.array_equal(np.concatenate(parts), whole.numpy())
    equal, _ = data.batch(3, 4, 1, 2, 4, 16)  # equal shares are the replica batches of before
    assert np.array_equal(data.share(3, 4, 4, 4, 8, 16)[0], equal)


def test_config_checks_batch_shares_against_the_plan():
    cluster = load_cluster(str(MIXED))
    config = RuntimeConfig.of(cluster, [[0, 2, 4]], batch_shares="speed", batch_size=4, microbatches=1)
    assert sum(config.batch_shares()) == 12
    with pytest.raises(RuntimeConfigError, match="schedule.batch_shares: 2 weights for 3 replicas"):
        RuntimeConfig.of(cluster, [[0, 2, 4]], batch_shares="1,2")
    with pytest.raises(RuntimeConfigError, match="per-step data parallelism only"):
        RuntimeConfig.of(cluster, [[0, 2, 4]], batch_shares="speed", sync_every=4)
    with pytest.raises(RuntimeConfigError, match="schedule.batch_shares"):
        RuntimeConfig.of(cluster, [[0, 2, 4]], batch_shares="quick")
