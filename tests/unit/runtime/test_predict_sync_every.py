"""A run with --sync-every H is charged one DP exchange per H steps (P fragments: P per H steps)."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.cluster import make_network
from geotrain.runtime.predict import predict_comm, predict_iteration_s, sync_rate

CLUSTER = make_network([2, 2], 10.0, (0.5, 0.5), (40.0, 40.0), seed=0)
ASSIGNMENT = np.array([[0, 2]])
DP_BYTES = [3_000_000]


def test_sync_rate_is_one_per_step_or_fragments_per_period():
    assert sync_rate(None) == 1.0 and sync_rate(5) == 0.2 and sync_rate(10, 4) == 0.4 and sync_rate(2, 4) == 1.0


def test_comm_prediction_charges_the_exchange_once_per_period_and_pipeline_every_step():
    every = predict_comm(CLUSTER, ASSIGNMENT, DP_BYTES, 0, 1.0)
    fifth = predict_comm(CLUSTER, ASSIGNMENT, DP_BYTES, 0, 1.0, syncs_per_step=sync_rate(5))
    assert every.dp_s > 0 and fifth.dp_s == pytest.approx(every.dp_s / 5) and fifth.pp_s == every.pp_s


@pytest.mark.parametrize("model", ["schedule", "ring", "yuan"])
def test_iteration_prediction_adds_a_fifth_of_the_exchange_to_the_step_without_it(model):
    compute = np.array([[0.2, 0.3]])

    def predict(dp_bytes, rate=1.0):
        return predict_iteration_s(CLUSTER, ASSIGNMENT, compute, dp_bytes, 0, 1, "gpipe", 1.0, model, 1, rate)

    without, with_sync = predict([0.0]), predict(DP_BYTES)
    assert with_sync > without
    assert predict(DP_BYTES, 0.2) == pytest.approx(without + 0.2 * (with_sync - without), rel=1e-9)
