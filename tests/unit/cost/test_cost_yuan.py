"""The default "yuan" cost model: DESIGN.md's sanity value, a hand-computed case, fast == reference."""

import numpy as np
import pytest

from geotrain.cluster import region_cluster, seed_datacenter, seed_geo
from geotrain.cost import (AssignmentError, YuanCostModel, as_assignment, build_cost_model, traffic_of_job,
                           yuan_cost_reference)
from geotrain.job import GPT_13B_SEED, Job, JobError


def test_datacenter_sanity_value_matches_design():
    model = YuanCostModel.for_job(seed_datacenter(), GPT_13B_SEED, stages=4, replicas=8)
    cost = model.evaluate(np.arange(32).reshape(4, 8))
    assert cost.dp == pytest.approx(0.365, rel=0.01)
    assert cost.pp == pytest.approx(2.062, rel=0.01)
    assert cost.total == pytest.approx(2.43, rel=0.01)


def test_seed_job_bytes():
    assert GPT_13B_SEED.dp_bytes(4) == pytest.approx(0.65e9)
    assert GPT_13B_SEED.pp_bytes(8) == pytest.approx(1.074e9, rel=1e-3)
    assert GPT_13B_SEED.compute_seconds(32) == pytest.approx(10.2, abs=0.05)


def test_two_region_case_by_hand():
    # 2 regions x 2 devices; 10 Gbit/s 1 ms inside, 1 Gbit/s 50 ms between. Job: c_dp = 1e9 B (S=2),
    # c_pp = 1 * 1000 * 1 * (4 // 2) = 2000 B (R=2).
    cluster = region_cluster("two", ["a", "b"], [2, 2], np.array([[10.0, 1.0], [1.0, 10.0]]),
                             np.array([[1.0, 50.0], [50.0, 1.0]]))
    job = Job("tiny", params=2e9, seq_len=1000, hidden=1, global_batch=4, bytes_per_value=1)
    model = YuanCostModel.for_job(cluster, job, stages=2, replicas=2)
    # stage 0 = {a0, b0}: cross-region DP; stage 1 = {a1, b1}. Pipelines a0->a1 and b0->b1 stay inside.
    cost = model.evaluate(np.array([[0, 2], [1, 3]]))
    dp_expected = 2 * (0.050 + 8 * 1e9 / (2 * 1e9))  # one peer, 1/2 of the gradient over 1 Gbit/s
    pp_expected = 2 * (0.001 + 8 * 2000 / 10e9)
    assert cost.dp == pytest.approx(dp_expected)
    assert cost.pp == pytest.approx(pp_expected)
    assert cost.total == pytest.approx(dp_expected + pp_expected)
    assert cost.dp_per_stage.tolist() == pytest.approx([dp_expected, dp_expected])


@pytest.mark.parametrize("stages,replicas", [(4, 8), (2, 5), (1, 32), (8, 1), (3, 7)])
def test_vectorised_matches_reference_on_random_assignments(stages, replicas):
    cluster = seed_geo()
    model = build_cost_model("yuan", cluster, GPT_13B_SEED, stages, replicas)
    rng = np.random.default_rng(stages * 100 + replicas)
    batch = np.stack([rng.permutation(32)[: stages * replicas].reshape(stages, replicas) for _ in range(25)])
    totals = model.evaluate_many(batch)
    for assignment, total in zip(batch, totals):
        ref = yuan_cost_reference(cluster, traffic_of_job(GPT_13B_SEED, stages, replicas), assignment.tolist())
        cost = model.evaluate(assignment)
        assert cost.dp == pytest.approx(ref["dp"], rel=1e-12)
        assert cost.pp == pytest.approx(ref["pp"], rel=1e-12)
        assert total == pytest.approx(ref["total"], rel=1e-12)


def test_infeasible_layouts_are_clear_errors():
    with pytest.raises(JobError, match="needs 40 devices, the cluster has 32"):
        YuanCostModel.for_job(seed_geo(), GPT_13B_SEED, stages=5, replicas=8)
    with pytest.raises(JobError, match="stages must be an integer >= 1"):
        YuanCostModel.for_job(seed_geo(), GPT_13B_SEED, stages=0, replicas=8)


def test_assignment_validation_names_the_problem():
    with pytest.raises(AssignmentError, match="used more than once"):
        as_assignment([[0, 1], [1, 2]], 2, 2, 32)
    with pytest.raises(AssignmentError, match=r"must be in 0\.\.31"):
        as_assignment([[0, 1], [2, 32]], 2, 2, 32)
    with pytest.raises(AssignmentError, match="shape"):
        as_assignment([[0, 1, 2]], 2, 2, 32)
