"""`region-paths`: with every region path allowed it is the exact path MILP (same optimum as `exact`);
with fewer paths it still returns a valid plan, never better than the optimum; bad options fail."""

import pytest

from geotrain.cluster import seed_geo
from geotrain.cost import build_cost_model
from geotrain.job import GPT_13B_SEED
from geotrain.search import PlacementProblem, SearchError, run_search


def seed_problem():
    cluster = seed_geo()
    return PlacementProblem(cluster, build_cost_model("yuan", cluster, GPT_13B_SEED, 4, 8))


def test_region_paths_with_every_path_finds_the_exact_optimum():
    problem = seed_problem()
    exact = run_search("exact", problem)
    every = run_search("region-paths", problem, options={"path_counts": (4 ** 4,)}, time_limit_s=60)
    assert every.details["milps"][0]["paths"] == 4 ** 4
    assert every.cost.total == pytest.approx(exact.cost.total, rel=1e-9)


def test_region_paths_over_few_paths_is_a_valid_plan_no_better_than_the_optimum():
    problem = seed_problem()
    exact = run_search("exact", problem)
    few = run_search("region-paths", problem, options={"path_counts": (8, 16)}, time_limit_s=20)
    assert [m["paths"] for m in few.details["milps"]] == [8, 16]
    assert few.cost.total == pytest.approx(problem.cost_model.evaluate(few.assignment).total)
    assert few.cost.total >= exact.cost.total * (1 - 1e-9)


@pytest.mark.parametrize("counts", [(), (0,), (True,), (2.5,)])
def test_region_paths_rejects_bad_path_counts(counts):
    with pytest.raises(SearchError, match="path_counts"):
        run_search("region-paths", seed_problem(), options={"path_counts": counts})
