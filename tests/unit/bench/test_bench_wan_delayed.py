"""bench wan's delayed-gradients row (geotrain.sync.delayed) and the cost model's price of it."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.bench.wan import DEFAULT_ROWS, LIMIT_ROW, WAN_CLUSTER, model_job
from geotrain.cluster import load_cluster
from geotrain.cost.wan_recipe import delayed_gradients_step_seconds, fragment_sync_seconds, recipe_step_seconds


def test_the_delayed_row_sits_before_the_limit_row_which_stays_last():
    delayed = [i for i, row in enumerate(DEFAULT_ROWS) if row.delayed_gradients]
    assert delayed == [19] and LIMIT_ROW == len(DEFAULT_ROWS) - 1 == 26
    row = DEFAULT_ROWS[19]
    assert (row.dp_codec, row.sync_every, row.sync_delay) == ("int8-block", 1, 1)
    # local SGD rows with a delay are Streaming DiLoCo, not delayed gradients
    assert not any(r.delayed_gradients for r in DEFAULT_ROWS if r.sync_every > 1)


def test_delayed_gradients_are_priced_as_the_exchange_hidden_behind_tau_steps_and_bounded_by_one_per_group():
    cluster, job = load_cluster(WAN_CLUSTER), model_job(32)
    assignment = np.arange(4).reshape(1, 4)
    sync_s = fragment_sync_seconds(cluster, job, assignment, 1, "int8-block")
    assert sync_s == pytest.approx(0.2164, abs=5e-4)  # one direct round: 150 ms + 66 ms (docs/history/wan.md)
    price = lambda compute, tau: delayed_gradients_step_seconds(cluster, job, assignment, compute, "int8-block", tau)
    assert price(0.1, 0) == pytest.approx(0.1 + sync_s)  # blocking: compute + exchange
    assert price(0.1, 1) == price(0.1, 2) == pytest.approx(sync_s)  # one exchange per group at a time
    assert price(0.3, 1) == pytest.approx(0.3)  # hidden behind one step
    assert price(0.15, 2) == pytest.approx(sync_s)  # hidden behind two steps, but still one per T
    assert price(0.1, 1) == recipe_step_seconds(sync_s, 0.1, 0.0, 1, 1, 1)  # H = P = 1 of the recipe's formula
