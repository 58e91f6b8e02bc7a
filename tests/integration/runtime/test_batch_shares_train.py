"""`train --batch-shares`: real gloo runs (2 stages x 2 replicas) with unequal shares of the global batch."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.cluster import make_network
from geotrain.data import world_tokens
from geotrain.runtime import RuntimeConfig, launch

CLUSTER = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0, name="test-2x2")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_unequal_shares_train_the_same_global_batch_in_sync():
    tokens = world_tokens(0)

    def run(shares: str):
        config = RuntimeConfig.of(cluster=CLUSTER, assignment=np.array([[0, 2], [1, 3]]), steps=3, time_scale=0.0,
                                  heartbeat_timeout_s=20.0, batch_size=4, microbatches=2, batch_shares=shares)
        return launch(config, tokens=tokens).report

    equal, shared = run("equal"), run("1,3")
    assert equal.samples == (4, 4) and shared.samples == (2, 6)  # 8 sequences in micro-batches of 2 per replica
    assert shared.replicas_in_sync  # the weighted exchange leaves every stage's replicas bit-identical
    # step 0 runs the same initial weights on the same 8 windows: the loss over the global batch (mean over
    # sequences, each replica's loss weighted by its share) is the same up to float32 summation order
    assert shared.rows[0].loss == pytest.approx(equal.rows[0].loss, rel=1e-5)
    assert all(np.isfinite(shared.losses))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_measured_shares_rebalance_in_whole_micro_batches_and_keep_replicas_in_sync():
    config = RuntimeConfig.of(cluster=CLUSTER, assignment=np.array([[0, 2], [1, 3]]), steps=7, time_scale=0.0,
                              heartbeat_timeout_s=20.0, batch_size=4, microbatches=2, batch_shares="measured",
                              chaos="slow:site=1,factor=6")
    report = launch(config, tokens=world_tokens(0)).report
    # replica 1 computes 6x slower from the start: after two re-balances (steps 3 and 6) it holds the least
    assert sum(report.samples) == 8 and all(n % 2 == 0 and n >= 2 for n in report.samples)
    assert report.samples[1] < report.samples[0]
    assert report.replicas_in_sync and all(np.isfinite(report.losses))
