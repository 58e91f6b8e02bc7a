"""`exact` (region MILP) equals brute force on tiny clusters; every lower bound is <= the optimum."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.cluster import Cluster, region_cluster, seed_geo
from geotrain.cost import build_cost_model
from geotrain.job import GPT_13B_SEED, Job
from geotrain.search import PlacementProblem, SearchError, run_search
from geotrain.search.bounds import combinatorial_bound, lower_bound
from geotrain.search.exact import solve_region_problem
from geotrain.search.layers import enumerate_compositions, solve_layer_milp, transport_seconds
from geotrain.search.milp import solve_flow_milp
from geotrain.search.regions import cheapest_path_seconds, region_terms

JOB = Job("small", params=4e8, seq_len=512, hidden=1024, global_batch=24, bytes_per_value=2)


def all_assignments(n_devices: int, stages: int, replicas: int) -> np.ndarray:
    return np.array([np.array(p).reshape(stages, replicas)
                     for p in itertools.permutations(range(n_devices), stages * replicas)])


def brute_force_optimum(model) -> float:
    return float(model.evaluate_many(all_assignments(model.n_devices, model.stages, model.replicas)).min())


def two_regions(intra_gbps, inter_gbps, intra_ms, inter_ms, sizes=(3, 3)) -> Cluster:
    bw = np.array([[intra_gbps, inter_gbps], [inter_gbps, intra_gbps]])
    ms = np.array([[intra_ms, inter_ms], [inter_ms, intra_ms]])
    return region_cluster("tiny", ["a", "b"], list(sizes), bw, ms, "V100")


@pytest.mark.parametrize("figures", [
    (10.0, 1.0, 0.1, 50.0),   # slow inter-region links
    (10.0, 8.0, 0.1, 5.0),    # nearly uniform
    (2.0, 1.5, 10.0, 20.0),   # latency-heavy
])
@pytest.mark.parametrize("stages,replicas", [(2, 3), (3, 2)])
def test_exact_equals_brute_force_on_two_regions_of_three(figures, stages, replicas):
    cluster = two_regions(*figures)
    model = build_cost_model("yuan", cluster, JOB, stages, replicas)
    result = run_search("exact", PlacementProblem(cluster, model))
    optimum = brute_force_optimum(model)  # all 720 assignments
    assert result.cost.total == pytest.approx(optimum, rel=1e-9)
    assert result.details["proven_optimal"]
    assert result.lower_bound == pytest.approx(result.cost.total, rel=1e-12)
    assert sorted(result.assignment.ravel().tolist()) == sorted(set(result.assignment.ravel().tolist()))


def test_exact_with_spare_devices_equals_brute_force():
    cluster = region_cluster("three", ["a", "b", "c"], [2, 2, 3], np.array([[10, 1, 2], [1, 10, 0.5], [2, 0.5, 5.0]]),
                             np.array([[0.1, 40, 20], [40, 0.1, 90], [20, 90, 1.0]]), "V100")
    model = build_cost_model("yuan", cluster, JOB, 2, 2)
    result = run_search("exact", PlacementProblem(cluster, model))
    assert result.cost.total == pytest.approx(brute_force_optimum(model), rel=1e-9)


def test_exact_solves_seed_geo_and_beats_or_ties_heuristics():
    cluster = seed_geo()
    problem = PlacementProblem(cluster, build_cost_model("yuan", cluster, GPT_13B_SEED, 4, 8))
    exact = run_search("exact", problem)
    assert exact.details["proven_optimal"]
    assert exact.cost.total == pytest.approx(19.2915, abs=1e-3)
    for method in ("pipeline-local", "hierarchical"):
        assert exact.cost.total <= run_search(method, problem, seed=0).cost.total * (1 + 1e-12)


def test_exact_refuses_non_uniform_clusters_and_non_pairwise_models():
    cluster = two_regions(10.0, 1.0, 0.1, 50.0)
    bandwidth = cluster.bandwidth_gbps.copy()
    bandwidth[0, 1] = bandwidth[1, 0] = 9.0
    jittered = Cluster(cluster.name, cluster.device_names, cluster.region_names, cluster.region_of, cluster.gpus,
                       bandwidth, cluster.latency_ms)
    with pytest.raises(SearchError, match="region-uniform"):
        run_search("exact", PlacementProblem(jittered, build_cost_model("yuan", jittered, JOB, 2, 3)))
    with pytest.raises(SearchError, match="pairwise"):
        run_search("exact", PlacementProblem(cluster, build_cost_model("ring", cluster, JOB, 2, 3)))


def random_cluster(seed: int, sizes: tuple[int, ...], jitter: float) -> Cluster:
    """Region-structured links with per-pair noise (so not region-uniform when jitter > 0)."""
    rng = np.random.default_rng(seed)
    G = len(sizes)
    bw = rng.uniform(0.3, 2.0, (G, G))
    bw = np.triu(bw, 1) + np.triu(bw, 1).T + np.diag(rng.uniform(5.0, 20.0, G))
    ms = rng.uniform(5.0, 150.0, (G, G))
    ms = np.triu(ms, 1) + np.triu(ms, 1).T + np.diag(rng.uniform(0.1, 2.0, G))
    base = region_cluster("random", [f"r{g}" for g in range(G)], list(sizes), bw, ms, "V100")
    n = base.n_devices
    noise = np.triu(rng.uniform(1 - jitter, 1 + jitter, (n, n)), 1)
    noise = noise + noise.T + np.eye(n)
    return Cluster(base.name, base.device_names, base.region_names, base.region_of, base.gpus,
                   base.bandwidth_gbps * noise, base.latency_ms * noise)


layouts = st.sampled_from([((3, 3), 2, 3), ((2, 2, 2), 3, 2), ((4, 2), 2, 2), ((2, 3, 1), 2, 3), ((5,), 2, 2)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts, st.floats(0.0, 0.3), st.integers(0, 10_000))
def test_every_lower_bound_is_at_most_the_optimum_on_random_clusters(layout, jitter, seed):
    sizes, stages, replicas = layout
    cluster = random_cluster(seed, sizes, jitter)
    model = build_cost_model("yuan", cluster, JOB, stages, replicas)
    totals = model.evaluate_many(all_assignments(cluster.n_devices, stages, replicas))
    optimum = float(totals.min())
    some_plan = float(totals[seed % len(totals)])
    problem = PlacementProblem(cluster, model)
    bound = lower_bound(problem, upper_bound_s=some_plan, time_limit_s=5.0)
    assert bound.value_s <= optimum * (1 + 1e-9)
    assert combinatorial_bound(model.pairwise_terms(), stages, replicas) <= optimum * (1 + 1e-9)
    # each region relaxation on its own, not only the one lower_bound picked
    terms = region_terms(cluster, model)
    assert solve_flow_milp(terms, stages, replicas, 5.0).bound <= optimum * (1 + 1e-9)
    assert solve_region_problem(terms, stages, replicas, time_limit_s=5.0, upper_bound_s=some_plan).milp.bound \
        <= optimum * (1 + 1e-9)
    compositions = enumerate_compositions(terms, replicas, some_plan - cheapest_path_seconds(terms, stages), 400)
    if compositions is not None and len(compositions):
        assert solve_layer_milp(terms, stages, replicas, compositions, 5.0).bound <= optimum * (1 + 1e-9)
    if jitter == 0.0:
        assert terms.exact and bound.value_s == pytest.approx(optimum, rel=1e-6)


def test_transport_seconds_matches_a_brute_force_on_small_margins():
    pp = np.array([[0.0, 3.0, 5.0], [3.0, 1.0, 2.0], [5.0, 2.0, 0.5]])
    a, b = np.array([2, 1, 1]), np.array([0, 2, 2])
    best = min(sum(pp[g, h] for g, h in zip(src, dst))
               for src in set(itertools.permutations([0, 0, 1, 2]))
               for dst in [(1, 1, 2, 2)])
    assert transport_seconds(pp, a, b) == pytest.approx(best)
    assert transport_seconds(pp, np.array([4, 0, 0]), b) == pytest.approx(2 * 3.0 + 2 * 5.0)
