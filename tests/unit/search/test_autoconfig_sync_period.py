"""Auto-configuration with the DP exchange every H steps (a WAN recipe's screen): dp charged / H, bounds valid."""

import numpy as np
import pytest

from geotrain.cluster import region_cluster
from geotrain.cost.compute import YuanComputeCostModel
from geotrain.job import Job
from geotrain.search.autoconfig import AutoConfigOptions, auto_configure
from geotrain.search.base import SearchError

JOB = Job(name="1b", params=1e9, seq_len=2048, hidden=2048, global_batch=512, layers=24, vocab=50257)


def three_sites():
    """Three sites of 4 A100s, 100 Gbit/s inside, 1 Gbit/s 50 ms between: per-step DP across them is dear."""
    gbps = np.full((3, 3), 1.0) + np.eye(3) * 99.0
    ms = np.full((3, 3), 50.0) - np.eye(3) * 49.9
    return region_cluster("a100x3", ["a", "b", "c"], [4, 4, 4], gbps, ms, gpus="A100")


def test_screening_for_a_recipe_charges_dp_per_period_and_spreads_over_sites():
    cluster = three_sites()
    per_step = auto_configure(cluster, JOB, AutoConfigOptions(rank_model="yuan+compute", top=3))
    periodic = auto_configure(cluster, JOB, AutoConfigOptions(rank_model="yuan+compute", top=3, sync_period=100))
    for result, period in ((per_step, 1), (periodic, 100)):
        for c in result.candidates:
            assert c.bound_s <= c.iteration_s * (1 + 1e-9)  # the bound holds for the model it ranks with
            model = YuanComputeCostModel.for_job(cluster, JOB, c.stages, c.replicas, micro_batches=c.microbatches)
            assert c.dp_s == pytest.approx(model.evaluate(c.assignment).dp / period, rel=1e-9)
    # per-step DP prefers pipelines to replicas across the 1 Gbit/s links; an exchange every 100 steps makes
    # data parallelism across them pay
    assert periodic.candidates[0].iteration_s < per_step.candidates[0].iteration_s
    assert periodic.candidates[0].replicas > per_step.candidates[0].replicas


@pytest.mark.parametrize("period", [0, -1, 2.5, True])
def test_sync_period_must_be_a_positive_integer(period):
    with pytest.raises(SearchError, match="sync period"):
        AutoConfigOptions(sync_period=period)
