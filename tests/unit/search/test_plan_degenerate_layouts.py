"""Pipeline-only (R = 1) and data-parallel-only (S = 1) layouts plan with every registered method,
and the lower bound holds for them (issue 11 item 3: `ValueError: zero-size array` in hierarchical)."""

import json

import numpy as np
import pytest

from geotrain.cli.main import main
from geotrain.cluster import make_network
from geotrain.cost import build_cost_model
from geotrain.job import GPT_13B_SEED
from geotrain.search import SEARCH_METHODS, PlacementProblem, lower_bound, run_search

FAST = {"random": {"samples": 20}, "local-search": {"iterations": 200, "restarts": 1},
        "genetic": {"population": 6, "children": 12, "improve_swaps": 200}, "hierarchical": {"starts": 2, "rounds": 2, "swaps": 200}}
LAYOUTS = [(1, 1), (2, 1), (8, 1), (1, 2), (1, 8)]


@pytest.fixture(scope="module")
def small_cluster():
    return make_network([3, 2, 3], 10.0, (0.3, 1.3), (10.0, 250.0), seed=5)


def _options(name):
    return FAST.get(name, {})


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda sr: f"{sr[0]}x{sr[1]}")
@pytest.mark.parametrize("name", sorted(SEARCH_METHODS))
def test_every_method_plans_pipeline_only_and_dp_only_layouts(small_cluster, name, layout):
    stages, replicas = layout
    model = build_cost_model("yuan", small_cluster, GPT_13B_SEED, stages, replicas)
    problem = PlacementProblem(small_cluster, model)
    result = run_search(name, problem, seed=1, options=_options(name))
    assignment = np.asarray(result.assignment)
    assert assignment.shape == (stages, replicas)
    assert len(set(assignment.ravel().tolist())) == stages * replicas
    assert result.cost.total == pytest.approx(model.evaluate(assignment).total)
    if replicas == 1:
        assert result.cost.dp == 0.0
    if stages == 1:
        assert result.cost.pp == 0.0
    bound = lower_bound(problem, upper_bound_s=result.cost.total, time_limit_s=5.0)
    assert bound.value_s <= result.cost.total * (1 + 1e-9)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda sr: f"{sr[0]}x{sr[1]}")
def test_exact_is_optimal_on_degenerate_layouts(small_cluster, layout):
    """The proven optimum is no worse than any heuristic's plan (and than brute force for R = 1, S = 2)."""
    stages, replicas = layout
    problem = PlacementProblem(small_cluster, build_cost_model("yuan", small_cluster, GPT_13B_SEED, stages, replicas))
    exact = run_search("exact", problem, seed=0)
    assert exact.lower_bound == pytest.approx(exact.cost.total, rel=1e-6)
    for name in ("hierarchical", "local-search"):
        assert exact.cost.total <= run_search(name, problem, seed=0, options=_options(name)).cost.total * (1 + 1e-9)
    if layout == (2, 1):
        pp = problem.cost_model.pairwise_terms().pp_pair_s
        brute = min(pp[i, j] for i in range(8) for j in range(8) if i != j)
        assert exact.cost.total == pytest.approx(brute)


@pytest.mark.parametrize("argv", [["--stages", "2", "--replicas", "1", "--method", "hierarchical"],
                                  ["--stages", "8", "--replicas", "1", "--lower-bound"],
                                  ["--stages", "1", "--replicas", "8", "--method", "hierarchical", "--lower-bound"]])
def test_plan_cli_pipeline_only_layouts(tmp_path, capsys, argv):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: tiny\nregions:\n  - {name: a, devices: 4, gpu: V100}\n  - {name: b, devices: 4, gpu: V100}\n"
                       "links:\n  - {between: [a, b], gbps: 1, ms: 50}\ndefaults: {intra: {gbps: 10, ms: 0.1}}\n")
    assert main(["plan", "--cluster", str(cluster), *argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["assignment"]) == int(argv[1]) and len(doc["assignment"][0]) == int(argv[3])
    if "--lower-bound" in argv:
        assert 0.0 <= doc["gap"] <= 1e-6  # this two-region uniform cluster is solved exactly


@pytest.mark.parametrize("layout", [(2, 4), (4, 2), (8, 1), (1, 8), (3, 2)])
def test_region_dp_floor_equals_the_device_level_combinatorial_bound(small_cluster, layout):
    """exact.dp_floor (per region) is the combinatorial dp bound of bounds (per device) on a
    region-uniform cluster: the pruning and the MILP cut it feeds are valid bounds on every plan's dp."""
    from geotrain.search.bounds import combinatorial_dp_bound
    from geotrain.search.regions import dp_floor, region_terms

    stages, replicas = layout
    model = build_cost_model("yuan", small_cluster, GPT_13B_SEED, stages, replicas)
    terms = region_terms(small_cluster, model)
    device_level = combinatorial_dp_bound(model.pairwise_terms().dp_pair_s, stages, replicas)
    assert dp_floor(terms, replicas, stages) == pytest.approx(device_level, rel=1e-12)
    exact = run_search("exact", PlacementProblem(small_cluster, model), seed=0)
    assert exact.cost.dp >= dp_floor(terms, replicas, stages) * (1 - 1e-12)
