"""The Traffic value: what a Job produces for planning, what measured bytes produce for prediction,
and how the communication models read it (per-stage sizes, looped cuts, sync period, empty cuts)."""

import numpy as np
import pytest

from geotrain.cluster import make_network, seed_geo
from geotrain.cost import (DtfmCostModel, RingCostModel, Traffic, TrafficError, WireBytes, YuanCostModel,
                           build_cost_model, traffic_of_job, yuan_cost_reference)
from geotrain.job import GPT_13B_SEED
from geotrain.runtime.predict import measured_traffic, predict_comm

GEO = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0)


def test_a_jobs_traffic_holds_its_byte_counts():
    traffic = traffic_of_job(GPT_13B_SEED, 4, 8)
    assert traffic.dp_bytes == (0.65e9,) * 4 and traffic.pp_bytes == (GPT_13B_SEED.pp_bytes(8),) * 3
    assert (traffic.stages, traffic.replicas, traffic.virtual_stages, traffic.sync_period) == (4, 8, 1, 1)
    assert traffic.bytes_per_value == 2 and traffic.wire == WireBytes() and traffic.dp_latency_rounds == 1.0


@pytest.mark.parametrize("fields,match", [
    ({"dp_bytes": (), "pp_bytes": ()}, "one entry per stage"),
    ({"dp_bytes": (1, -2), "pp_bytes": (1,)}, "dp_bytes must be finite byte counts >= 0, got -2"),
    ({"dp_bytes": (1, 2), "pp_bytes": (1, 1)}, "S x V - 1 cuts for S = 2 stages, got 2"),
    ({"dp_bytes": (1,), "pp_bytes": (), "sync_period": 0}, "sync_period must be an integer >= 1, got 0"),
    ({"dp_bytes": (1,), "pp_bytes": (), "replicas": 1.5}, "replicas must be an integer >= 1, got 1.5"),
])
def test_bad_traffic_is_refused_naming_the_field(fields, match):
    with pytest.raises(TrafficError, match=match):
        Traffic(**{"replicas": 2, **fields})


def test_per_stage_bytes_and_looped_cuts_agree_with_the_reference():
    cluster = seed_geo()
    rng = np.random.default_rng(5)
    for traffic in (Traffic(dp_bytes=(3e8, 1e8, 2e8), pp_bytes=(4e8, 1e8), replicas=4),
                    Traffic(dp_bytes=(3e8, 1e8, 2e8), pp_bytes=(4e8, 1e8, 2e8, 3e8, 5e8), replicas=4,
                            wire=WireBytes(dp_inter=0.25, pp_intra=4, dp_latency_rounds=2), bytes_per_value=2),
                    Traffic(dp_bytes=(3e8, 3e8), pp_bytes=(0.0,), replicas=5, sync_period=4)):
        model = YuanCostModel(cluster, traffic)
        assert (model.pairwise_terms() is None) == (not (traffic.uniform_dp() and traffic.uniform_pp()))
        batch = np.stack([rng.permutation(32)[: traffic.stages * traffic.replicas].reshape(traffic.stages, -1)
                          for _ in range(6)])
        for assignment, total in zip(batch, model.evaluate_many(batch)):
            ref = yuan_cost_reference(cluster, traffic, assignment.tolist())
            cost = model.evaluate(assignment)
            assert (cost.dp, cost.pp, total) == pytest.approx((ref["dp"], ref["pp"], ref["total"]), rel=1e-12)


def test_sync_period_divides_only_the_dp_exchange():
    every = Traffic(dp_bytes=(3e6, 3e6), pp_bytes=(1e6,), replicas=2)
    fourth = Traffic(dp_bytes=(3e6, 3e6), pp_bytes=(1e6,), replicas=2, sync_period=4)
    assignment = np.array([[0, 2], [1, 3]])
    for cls in (YuanCostModel, RingCostModel, DtfmCostModel):
        a, b = cls(GEO, every).evaluate(assignment), cls(GEO, fourth).evaluate(assignment)
        assert b.dp == pytest.approx(a.dp / 4) and b.pp == pytest.approx(a.pp), cls.name


def test_an_empty_cut_or_stage_sends_nothing():
    assignment = np.array([[0, 2], [1, 3]])
    cost = YuanCostModel(GEO, Traffic(dp_bytes=(0.0, 5e5), pp_bytes=(0.0,), replicas=2)).evaluate(assignment)
    assert cost.pp == 0.0 and cost.dp_per_stage[0] == 0.0 and cost.dp_per_stage[1] > 0.04  # 2 x 20 ms at least


def test_one_model_per_prediction_gives_each_stage_its_own_bytes():
    """Before, predict_comm built one model per stage (a fake Job of that stage's bytes); one model on the
    measured traffic must give the same per-stage seconds."""
    assignment = np.array([[0, 2], [1, 3]])
    dp_bytes = [500_000, 2_000_000]
    for name in ("yuan", "ring"):
        prediction = predict_comm(GEO, assignment, dp_bytes, 200_000, 0.1, name)
        for stage, nbytes in enumerate(dp_bytes):
            alone = build_cost_model(name, GEO, _bytes_job(nbytes, 200_000), 2, 2).evaluate(assignment)
            assert prediction.dp_per_stage_s[stage] == pytest.approx(0.1 * alone.dp_per_stage[stage], rel=1e-12)
            assert prediction.pp_s == pytest.approx(0.1 * alone.pp, rel=1e-12)


def _bytes_job(dp_bytes, pp_bytes):
    from geotrain.job import Job

    return Job(name="bytes", params=dp_bytes * 2.0, seq_len=1, hidden=1, global_batch=pp_bytes * 2, layers=2,
               bytes_per_value=1)


def test_dtfm_refuses_looped_traffic():
    with pytest.raises(TrafficError, match="dtfm"):
        DtfmCostModel(GEO, measured_traffic([1e6, 1e6], 2e5, 2, virtual_stages=2))
