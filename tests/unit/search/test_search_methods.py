"""Placement search: every method is valid and seeded; incremental swap evaluation == full recompute;
the seed's demo-1 shape on seed-geo."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import make_network, seed_geo
from geotrain.cost import as_assignment, build_cost_model
from geotrain.job import GPT_13B_SEED
from geotrain.search import (
    SEARCH_METHODS,
    PlacementProblem,
    SearchError,
    improve,
    pipeline_local_assignment,
    run_search,
)
from geotrain.search.incremental import (
    ACCEPT_ALL,
    ACCEPT_SIDEWAYS,
    ACCEPT_STRICT,
    REL_TOL,
    draw_swaps,
    full_total,
    init_state,
    swap_search,
    swap_search_full,
)

FAST_OPTIONS = {"random": {"samples": 50}, "local-search": {"iterations": 2000, "restarts": 2}}
# The methods of this suite; methods registered by other modules are tested beside their code.
METHODS = ("random", "pipeline-local", "dp-local", "local-search")


def test_methods_are_registered():
    assert set(METHODS) <= set(SEARCH_METHODS)


def problem_for(cluster, stages, replicas):
    return PlacementProblem(cluster, build_cost_model("yuan", cluster, GPT_13B_SEED, stages, replicas))


@pytest.fixture(scope="module")
def seed_problem():
    return problem_for(seed_geo(), 4, 8)


@pytest.fixture(scope="module")
def irregular_cluster():
    return make_network([5, 9, 3, 12, 2], 10.0, (0.3, 1.3), (10.0, 250.0), seed=3)


def options_for(name):
    return FAST_OPTIONS.get(name, {})


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("layout", [(4, 7), (3, 7), (1, 31), (31, 1), (6, 5)])
def test_every_method_returns_a_valid_assignment(name, layout, irregular_cluster):
    problem = problem_for(irregular_cluster, *layout)
    result = run_search(name, problem, seed=1, options=options_for(name))
    assignment = as_assignment(result.assignment, *layout, irregular_cluster.n_devices)
    assert result.cost.total == pytest.approx(problem.cost_model.evaluate(assignment).total, rel=1e-12)
    assert result.evaluations >= 1


@pytest.mark.parametrize("name", METHODS)
def test_same_seed_same_result(name, seed_problem):
    first = run_search(name, seed_problem, seed=7, options=options_for(name))
    second = run_search(name, seed_problem, seed=7, options=options_for(name))
    assert np.array_equal(first.assignment, second.assignment)
    assert first.cost.total == second.cost.total
    assert first.details.get("per_restart_totals") == second.details.get("per_restart_totals")


def test_local_search_restarts_depend_on_seed_and_restart_index_only(seed_problem):
    three = run_search("local-search", seed_problem, seed=3, options={"iterations": 500, "restarts": 3})
    five = run_search("local-search", seed_problem, seed=3, options={"iterations": 500, "restarts": 5})
    other = run_search("local-search", seed_problem, seed=4, options={"iterations": 500, "restarts": 3})
    assert five.details["per_restart_totals"][:3] == three.details["per_restart_totals"]
    assert other.details["per_restart_totals"] != three.details["per_restart_totals"]


def test_search_options_are_checked(seed_problem):
    with pytest.raises(SearchError, match="has no option 'samples'"):
        run_search("local-search", seed_problem, options={"samples": 3})
    with pytest.raises(SearchError, match="iterations must be an integer >= 0"):
        run_search("local-search", seed_problem, options={"iterations": -1})
    with pytest.raises(SearchError, match="unknown search method"):
        run_search("annealing", seed_problem)


def _kernel_inputs(cluster, stages, replicas, seed):
    model = build_cost_model("yuan", cluster, GPT_13B_SEED, stages, replicas)
    terms = model.pairwise_terms()
    rng = np.random.default_rng(seed)
    order = rng.permutation(cluster.n_devices).astype(np.int64)
    first, second = draw_swaps(rng, 300, stages * replicas, cluster.n_devices)
    return model, np.ascontiguousarray(terms.dp_pair_s), np.ascontiguousarray(terms.pp_pair_s), order, first, second


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4), seed=st.integers(0, 2**31 - 1),
       shape=st.tuples(st.integers(1, 5), st.integers(1, 5)))
def test_incremental_equals_full_recompute_on_random_swaps(sizes, seed, shape):
    cluster = make_network(sizes, 10.0, (0.3, 1.3), (10.0, 250.0), seed=seed % 1000)
    stages, replicas = shape
    if stages * replicas > cluster.n_devices or cluster.n_devices < 2:
        return
    model, dp_pair, pp_pair, order, first, second = _kernel_inputs(cluster, stages, replicas, seed)
    rowsum, dp_stage, pp_rep = init_state(dp_pair, pp_pair, order.copy(), stages, replicas)
    walked = order.copy()
    trace = np.empty(first.size)
    accepted = swap_search(dp_pair, pp_pair, stages, replicas, walked, rowsum, dp_stage, pp_rep,
                           first, second, ACCEPT_ALL, REL_TOL, trace)
    assert accepted == first.size
    replay = order.copy()
    for t, (i, j) in enumerate(zip(first, second)):
        replay[i], replay[j] = replay[j], replay[i]
        slots = replay[: stages * replicas].reshape(stages, replicas)
        assert trace[t] == pytest.approx(model.evaluate(slots).total, rel=1e-9, abs=1e-12)
    assert np.array_equal(walked, replay)
    fresh = init_state(dp_pair, pp_pair, walked, stages, replicas)
    for kept, recomputed in zip((rowsum, dp_stage, pp_rep), fresh):
        assert np.allclose(kept, recomputed, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", [ACCEPT_STRICT, ACCEPT_SIDEWAYS])
@pytest.mark.parametrize("layout", [(4, 8), (3, 5)])
def test_incremental_walk_matches_full_recompute_walk(mode, layout):
    model, dp_pair, pp_pair, order, first, second = _kernel_inputs(seed_geo(), *layout, seed=11)
    fast = order.copy()
    state = init_state(dp_pair, pp_pair, fast, *layout)
    accepted = swap_search(dp_pair, pp_pair, *layout, fast, *state, first, second, mode, REL_TOL, np.empty(0))
    slow = order.copy()
    accepted_full, total_full = swap_search_full(dp_pair, pp_pair, *layout, slow, first, second, mode, REL_TOL)
    assert accepted == accepted_full > 0
    assert np.array_equal(fast, slow)
    assert total_full == pytest.approx(full_total(dp_pair, pp_pair, fast, *layout), rel=1e-12)
    assert total_full == pytest.approx(model.evaluate(fast[: layout[0] * layout[1]].reshape(layout)).total, rel=1e-12)


class _NoPairwise:
    """The yuan model without its pairwise form: forces local search onto the full-recompute path."""

    def __init__(self, model):
        self._model = model
        self.name, self.stages, self.replicas, self.n_devices = "plain", model.stages, model.replicas, model.n_devices

    def evaluate(self, assignment):
        return self._model.evaluate(assignment)

    def evaluate_many(self, assignments):
        return self._model.evaluate_many(assignments)

    def pairwise_terms(self):
        return None


def test_local_search_without_pairwise_terms_matches_incremental(seed_problem):
    options = {"iterations": 600, "restarts": 2, "strict": True}
    fast = run_search("local-search", seed_problem, seed=5, options=options)
    plain = PlacementProblem(seed_problem.cluster, _NoPairwise(seed_problem.cost_model))
    slow = run_search("local-search", plain, seed=5, options=options)
    assert fast.details["incremental"] and not slow.details["incremental"]
    assert np.array_equal(fast.assignment, slow.assignment)
    assert fast.details["per_restart_totals"] == pytest.approx(slow.details["per_restart_totals"], rel=1e-12)


def test_improve_never_worsens_and_reports_the_model_total(seed_problem, irregular_cluster):
    for problem in (seed_problem, problem_for(irregular_cluster, 3, 7)):
        model = problem.cost_model
        start = np.random.default_rng(0).permutation(problem.n_devices)[: problem.stages * problem.replicas]
        start = start.reshape(problem.stages, problem.replicas)
        rng = np.random.default_rng(9)
        better = improve(model, start, 3000, rng=rng)
        assignment, total, evaluations = better
        as_assignment(assignment, problem.stages, problem.replicas, problem.n_devices)
        assert evaluations == 3000
        assert total == pytest.approx(model.evaluate(assignment).total, rel=1e-9)
        assert total < model.evaluate(start).total
        again = improve(model, start, 3000, rng=9)
        assert np.array_equal(again.assignment, assignment)
        strict = improve(model, start, 3000, strict=True, rng=9)
        assert strict.total <= model.evaluate(start).total


# ---- the seed's demo-1 shape on seed-geo ------------------------------------------------------

SEED_PLANS = {}


def seed_results(problem):
    if not SEED_PLANS:
        SEED_PLANS["random"] = run_search("random", problem, seed=0, options={"samples": 200})
        SEED_PLANS["pipeline-local"] = run_search("pipeline-local", problem)
        SEED_PLANS["dp-local"] = run_search("dp-local", problem)
        SEED_PLANS["strict"] = run_search("local-search", problem, seed=0,
                                          options={"iterations": 3000, "restarts": 5, "strict": True})
        SEED_PLANS["sideways"] = run_search("local-search", problem, seed=0,
                                            options={"iterations": 20000, "restarts": 5})
    return SEED_PLANS


def test_pipeline_local_is_the_seeds_plan_on_seed_geo(seed_problem):
    result = seed_results(seed_problem)["pipeline-local"]
    # seed: replica rep in region rep // 2, stage s on that region's device (rep % 2) * 4 + s
    seed_plan = np.array([[8 * (rep // 2) + (rep % 2) * 4 + s for rep in range(8)] for s in range(4)])
    assert np.array_equal(result.assignment, seed_plan)
    assert np.array_equal(pipeline_local_assignment(seed_problem.cluster, 4, 8, [2, 2, 2, 2]), seed_plan)


def test_dp_local_keeps_every_stage_in_one_region_and_beats_the_seed_order(seed_problem):
    result = seed_results(seed_problem)["dp-local"]
    regions = seed_problem.cluster.region_of[result.assignment]
    assert all(len(set(row)) == 1 for row in regions.tolist())
    assert sorted(regions[:, 0].tolist()) == [0, 1, 2, 3]
    in_order = seed_problem.cost_model.evaluate(np.arange(32).reshape(4, 8)).total
    assert result.details["in_order_total"] == pytest.approx(in_order)
    assert result.cost.total <= in_order


def test_pipeline_local_beats_dp_local_on_seed_geo(seed_problem):
    plans = seed_results(seed_problem)
    assert plans["pipeline-local"].cost.total < 0.5 * plans["dp-local"].cost.total


def test_strict_local_search_stalls_clearly_above_sideways(seed_problem):
    plans = seed_results(seed_problem)
    assert plans["strict"].cost.total > 1.5 * plans["sideways"].cost.total
    assert min(plans["strict"].details["per_restart_totals"]) > 1.5 * plans["sideways"].cost.total


def test_sideways_best_of_5_at_or_below_best_hand_made_plan(seed_problem):
    plans = seed_results(seed_problem)
    best_hand_made = min(plans["pipeline-local"].cost.total, plans["dp-local"].cost.total)
    assert plans["sideways"].cost.total <= best_hand_made * (1 + 1e-12)


def test_random_mean_at_least_5x_best_plan(seed_problem):
    plans = seed_results(seed_problem)
    best = min(plan.cost.total for plan in plans.values())
    assert plans["random"].details["mean_total"] >= 5 * best


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 10), min_size=1, max_size=5), stages=st.integers(1, 4),
       replicas=st.integers(1, 6))
def test_region_heuristics_keep_whole_units_inside_regions(sizes, stages, replicas):
    cluster = make_network(sizes, 10.0, (0.3, 1.3), (10.0, 250.0), seed=len(sizes))
    if stages * replicas > cluster.n_devices:
        with pytest.raises(Exception, match="needs"):
            problem_for(cluster, stages, replicas)
        return
    problem = problem_for(cluster, stages, replicas)
    regions_of = lambda result: cluster.region_of[result.assignment]  # noqa: E731
    pipelines = run_search("pipeline-local", problem)
    whole_pipelines = sum(len(set(col)) == 1 for col in regions_of(pipelines).T.tolist())
    assert whole_pipelines >= min(replicas, int(np.sum(cluster.region_sizes() // stages)))
    groups = run_search("dp-local", problem)
    whole_groups = sum(len(set(row)) == 1 for row in regions_of(groups).tolist())
    assert whole_groups >= min(stages, int(np.sum(cluster.region_sizes() // replicas)))


def test_improve_on_a_model_without_pairwise_terms_stops_at_its_deadline():
    """A walk of full evaluations (here "schedule") reads the clock between chunks of swaps: past its deadline it
    makes none; without a deadline it makes them all (genetic passes its time limit as the deadline)."""
    import time

    from geotrain.search.local_search import improve

    model = build_cost_model("schedule", seed_geo(), GPT_13B_SEED, 2, 4)
    start = np.arange(8).reshape(2, 4)
    assert improve(model, start, 100, rng=0, deadline=time.perf_counter() - 1.0).evaluations == 0
    assert improve(model, start, 100, rng=0).evaluations == 100
