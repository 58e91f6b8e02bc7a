"""Lazy region paths (`exact.solve_region_problem` with few paths allowed): every bound it reports is
<= the brute-force optimum, and exact still finds the optimum when its bound reaches the plan."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.cost import build_cost_model
from geotrain.search import PlacementProblem
from geotrain.search.exact import ExactConfig, dp_lower_bound, exact_search, paths_below, solve_region_problem
from geotrain.search.regions import enumerate_paths, region_terms
from test_placement_exact import JOB, all_assignments, random_cluster

layouts = st.sampled_from([((3, 3), 2, 3), ((2, 2, 2), 3, 2), ((2, 3, 1), 2, 3), ((2, 2, 2, 1), 3, 2)])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts, st.sampled_from([0.0, 0.2]), st.integers(1, 4), st.integers(0, 10_000))
def test_lazy_path_bound_is_at_most_the_brute_force_optimum(layout, jitter, max_paths, seed):
    sizes, stages, replicas = layout
    cluster = random_cluster(seed, sizes, jitter)
    model = build_cost_model("yuan", cluster, JOB, stages, replicas)
    totals = model.evaluate_many(all_assignments(cluster.n_devices, stages, replicas))
    optimum = float(totals.min())
    terms = region_terms(cluster, model)
    solution = solve_region_problem(terms, stages, replicas, max_paths=max_paths, time_limit_s=5.0)
    assert solution.bound_s <= optimum * (1 + 1e-9)
    if jitter == 0.0:  # region-uniform: exact's plan is feasible and its certificate honest
        result = exact_search(PlacementProblem(cluster, model), ExactConfig(max_paths=max_paths), seed=0,
                              time_limit_s=5.0)
        assert result.lower_bound <= optimum * (1 + 1e-9) <= result.cost.total * (1 + 1e-9)
        if result.details["proven_optimal"]:
            assert result.cost.total == pytest.approx(optimum, rel=1e-9)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts, st.integers(0, 10_000))
def test_dp_lower_bound_holds_for_every_plan_within_the_upper_bound(layout, seed):
    sizes, stages, replicas = layout
    cluster = random_cluster(seed, sizes, 0.0)
    model = build_cost_model("yuan", cluster, JOB, stages, replicas)
    plans = all_assignments(cluster.n_devices, stages, replicas)
    totals = model.evaluate_many(plans)
    upper = float(np.quantile(totals, 0.3))
    low = dp_lower_bound(region_terms(cluster, model), stages, replicas, upper, 5.0)
    within = [model.evaluate(a).dp for a, t in zip(plans, totals) if t <= upper]
    assert low <= min(within) * (1 + 1e-9)


def test_paths_below_keeps_every_path_up_to_its_cap_and_no_more_than_allowed():
    cluster = random_cluster(3, (2, 2, 2, 2), 0.0)
    terms = region_terms(cluster, build_cost_model("yuan", cluster, JOB, 4, 2))
    paths, seconds, cap = paths_below(terms, 4, 1e9, 50)
    assert len(paths) <= 50 and np.all(np.diff(seconds) >= 0) and seconds.max() <= cap * (1 + 1e-9)
    everything = enumerate_paths(terms, 4, 1e9, 10**6)
    assert len(everything[0]) == 4 ** 4
    assert int((everything[1] <= cap).sum()) == len(paths)  # all paths up to the cap, none missing


def test_exact_from_a_known_plan_keeps_it_when_nothing_beats_it_and_replaces_a_worse_one():
    cluster = random_cluster(11, (3, 3), 0.0)
    model = build_cost_model("yuan", cluster, JOB, 2, 3)
    plans = all_assignments(cluster.n_devices, 2, 3)
    totals = model.evaluate_many(plans)
    problem = PlacementProblem(cluster, model)
    best = exact_search(problem, ExactConfig(), seed=0, initial=plans[int(np.argmin(totals))])
    assert best.cost.total == pytest.approx(float(totals.min()), rel=1e-9) and best.details["proven_optimal"]
    worse = exact_search(problem, ExactConfig(), seed=0, initial=plans[int(np.argmax(totals))])
    assert worse.cost.total == pytest.approx(float(totals.min()), rel=1e-9)
