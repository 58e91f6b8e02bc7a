"""Every placement of a small problem, scored (search/every_placement.py): the count, the optimum against exact's
certified one (an independent method), and `auto` using it where exact does not apply."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import make_network, seed_geo
from geotrain.cost import build_cost_model
from geotrain.job import GPT_13B_SEED
from geotrain.search import PlacementProblem, run_search
from geotrain.search.every_placement import MAX_PLACEMENTS, enumerable, every_placement_search, placement_count


@given(st.integers(0, 12), st.integers(0, 12))
@settings(max_examples=60, deadline=None)
def test_the_count_is_the_injective_maps_of_slots_to_devices(devices, slots):
    expected = math.factorial(devices) // math.factorial(devices - slots) if slots <= devices else 0
    assert placement_count(devices, slots) == expected


def test_the_enumerated_optimum_is_exacts_certified_one_on_a_uniform_cluster():
    cluster = make_network([3, 3], 10.0, (0.5, 1.0), (10.0, 50.0), seed=4)  # region-uniform: exact applies
    problem = PlacementProblem(cluster, build_cost_model("yuan", cluster, GPT_13B_SEED, 2, 2))
    assert enumerable(problem) and placement_count(6, 4) == 360
    every = every_placement_search(problem)
    exact = run_search("exact", problem, seed=0)
    assert exact.proven_optimal and every.proven_optimal and every.evaluations == 360
    assert every.cost.total == pytest.approx(exact.cost.total, rel=1e-12)
    assert every.cost.total == pytest.approx(problem.cost_model.evaluate(every.assignment).total, rel=1e-12)
    assert sorted(np.asarray(every.assignment).ravel().tolist()) == sorted(set(np.asarray(every.assignment).ravel()))


def test_auto_scores_every_placement_of_a_small_problem_whose_model_is_not_pairwise():
    cluster = make_network([3, 3], 10.0, (0.5, 1.0), (10.0, 50.0), seed=4)
    problem = PlacementProblem(cluster, build_cost_model("yuan+compute", cluster, GPT_13B_SEED, 2, 2))
    auto = run_search("auto", problem, seed=0)
    genetic = run_search("genetic", problem, seed=0)
    assert auto.details["found_by"] == "every-placement" and auto.proven_optimal
    assert auto.cost.total <= genetic.cost.total * (1 + 1e-12)  # the optimum: no heuristic beats it
    large = PlacementProblem(seed_geo(), build_cost_model("yuan+compute", seed_geo(), GPT_13B_SEED, 2, 2))
    assert placement_count(large.n_devices, 4) > MAX_PLACEMENTS and not enumerable(large)
