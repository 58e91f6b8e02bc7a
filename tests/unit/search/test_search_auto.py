"""`auto`: exact where it applies, otherwise the best heuristic; skipped methods are recorded."""

import numpy as np
import pytest

from geotrain.cluster import make_network, region_cluster, seed_geo
from geotrain.cost import as_assignment, build_cost_model
from geotrain.job import GPT_13B_SEED
from geotrain.search import PlacementProblem, SearchError, run_search


def _problem(cluster, stages, replicas, model="yuan"):
    return PlacementProblem(cluster, build_cost_model(model, cluster, GPT_13B_SEED, stages, replicas))


def test_auto_returns_the_proven_optimum_on_seed_geo():
    problem = _problem(seed_geo(), 4, 8)
    auto = run_search("auto", problem, seed=0)
    exact = run_search("exact", problem, seed=0)
    assert auto.details["chosen"] == "exact"
    assert auto.cost.total == pytest.approx(exact.cost.total, rel=1e-12)
    assert auto.lower_bound == pytest.approx(auto.cost.total, rel=1e-9)
    assert [t["method"] for t in auto.details["tried"]] == ["exact"]  # optimal: nothing else needed


def test_auto_falls_back_to_heuristics_on_a_non_uniform_cluster():
    base = make_network([4, 4], 10.0, (0.5, 1.0), (10.0, 50.0), seed=3)
    jitter = 1.0 + 0.2 * np.random.default_rng(0).random((8, 8))
    bandwidth = base.bandwidth_gbps * (jitter + jitter.T) / 2
    cluster = region_cluster("jitter", ["a", "b"], [4, 4], np.ones((2, 2)), np.ones((2, 2)))
    cluster = type(cluster)(name="jitter", device_names=cluster.device_names, region_names=cluster.region_names,
                            region_of=cluster.region_of, gpus=cluster.gpus, bandwidth_gbps=bandwidth,
                            latency_ms=base.latency_ms)
    problem = _problem(cluster, 2, 4)
    auto = run_search("auto", problem, seed=1)
    tried = {t["method"]: t for t in auto.details["tried"]}
    assert "region-uniform" in tried["exact"]["skipped"]
    assert {"hierarchical", "genetic"} <= set(tried)
    assert auto.cost.total == pytest.approx(min(tried[m]["total"] for m in ("hierarchical", "genetic")))
    as_assignment(auto.assignment, 2, 4, 8)
    assert run_search("auto", problem, seed=1).assignment.tolist() == auto.assignment.tolist()


def test_auto_with_a_non_pairwise_model_uses_what_applies():
    problem = _problem(seed_geo(), 2, 4, model="ring")
    auto = run_search("auto", problem, seed=0)
    tried = {t["method"]: t for t in auto.details["tried"]}
    assert "skipped" in tried["exact"] and "skipped" in tried["hierarchical"]
    assert auto.details["chosen"] == "genetic"
    assert auto.cost.total == pytest.approx(problem.cost_model.evaluate(auto.assignment).total)


def test_auto_rejects_unknown_fallbacks():
    with pytest.raises(SearchError, match="fallbacks"):
        run_search("auto", _problem(seed_geo(), 4, 8), options={"fallbacks": "annealing"})


def test_on_plan_hears_autos_improvements_as_found_and_another_methods_result_once():
    problem = _problem(seed_geo(), 4, 8)
    heard = []
    auto = run_search("auto", problem, seed=0, time_limit_s=3.0, options={"try_exact": False}, on_plan=heard.append)
    totals = [r.cost.total for r in heard]
    assert totals and totals == sorted(totals, reverse=True) and len(set(totals)) == len(totals)
    assert totals == [total for _, total, _ in auto.details["trajectory"]]
    assert totals[-1] == auto.cost.total
    heard.clear()
    hierarchical = run_search("hierarchical", problem, seed=0, on_plan=heard.append)
    assert heard == [hierarchical]


def test_auto_on_a_model_with_compute_ranks_a_plan_on_the_fastest_devices():
    """"schedule" is searched on its links-only surrogate, which prefers the T4 sites' better links; the region
    heuristics rerun on the fastest devices alone give the ranking the H100 plan, which computes ~8x faster."""
    bandwidth = np.array([[10.0, 1.0, 0.5], [1.0, 10.0, 0.5], [0.5, 0.5, 5.0]])
    latency = np.array([[0.1, 20.0, 80.0], [20.0, 0.1, 80.0], [80.0, 80.0, 0.1]])
    cluster = region_cluster("speeds", ["t4a", "t4b", "h100"], [4, 4, 4], bandwidth, latency, gpus=["T4", "T4", "H100"])
    problem = _problem(cluster, 2, 2, model="schedule")
    surrogate = run_search("auto", PlacementProblem(cluster, problem.cost_model.surrogate), seed=0)
    assert set(np.ravel(surrogate.assignment)) <= set(range(8))  # links only: the T4 sites
    auto = run_search("auto", problem, seed=0)
    assert auto.details["chosen"].endswith("(fastest)") and set(np.ravel(auto.assignment)) == set(range(8, 12))
    assert auto.cost.total < problem.cost_model.evaluate(surrogate.assignment).total / 3
    assert auto.cost.total == pytest.approx(problem.cost_model.evaluate(auto.assignment).total, rel=1e-12)
