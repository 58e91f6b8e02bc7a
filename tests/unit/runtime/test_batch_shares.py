"""Batch shares: the split of the global batch (runtime/batch_shares.py) and its place in the config."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.cluster import load_cluster
from geotrain.data import world_tokens
from geotrain.runtime.batch_shares import BatchSharesError, gradient_factor, parse_batch_shares, share_offset
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


def test_gradient_factors_make_the_mean_a_sample_weighted_mean():
    shares = (2, 3, 7)
    factors = [gradient_factor(shares, r) for r in range(3)]
    assert np.isclose(np.mean(factors), 1.0)
    assert [share_offset(shares, r) for r in range(3)] == [0, 2, 5]


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
    with pytest.raises(RuntimeConfigError, match=r"^--batch-shares speed with --sync-every 4: shares of the batch balance per-step data parallelism"):
        RuntimeConfig.of(cluster, [[0, 2, 4]], batch_shares="speed", sync_every=4)
    with pytest.raises(RuntimeConfigError, match="schedule.batch_shares"):
        RuntimeConfig.of(cluster, [[0, 2, 4]], batch_shares="quick")


def test_measured_shares_start_as_speed_and_rebalance_every_few_steps():
    from geotrain.runtime.batch_shares import REBALANCE_EVERY, rebalance_due

    cluster = load_cluster(str(MIXED))
    config = RuntimeConfig.of(cluster, [[0, 2, 4]], batch_shares="measured", batch_size=8, microbatches=1)
    assert config.batch_shares() == (15, 6, 3)
    due = [step for step in range(10) if rebalance_due("measured", step)]
    assert due == [REBALANCE_EVERY * k - 1 for k in range(1, 10 // REBALANCE_EVERY + 1)]
    assert not any(rebalance_due(rule, 2) for rule in ("equal", "speed"))
