"""The pipeline floor (`milp.pp_floor`) and the path staircase (`path_stairs`) against brute force on
small random region problems: every region assignment of S x R slots within the region sizes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from geotrain.search.milp import crossing_path_seconds, pp_floor
from geotrain.search.path_stairs import path_staircase_bound
from geotrain.search.regions import RegionTerms, cheapest_path_seconds, enumerate_paths


def _random_terms(rng: np.random.Generator, sizes: list[int]) -> RegionTerms:
    G = len(sizes)
    dp = rng.uniform(0.2, 1.0, (G, G))
    pp = rng.uniform(2.0, 9.0, (G, G))
    dp, pp = (dp + dp.T) / 2, (pp + pp.T) / 2
    np.fill_diagonal(dp, rng.uniform(0.01, 0.05, G))
    np.fill_diagonal(pp, rng.uniform(0.1, 0.5, G))
    return RegionTerms(sizes=np.array(sizes, dtype=np.int64), dp_s=dp, pp_s=pp, exact=True)


def _all_plans(terms: RegionTerms, stages: int, replicas: int) -> np.ndarray:
    """(total, PP) of every region assignment (S, R) that fits the sizes."""
    out = []
    for flat in itertools.product(range(terms.n_regions), repeat=stages * replicas):
        if (np.bincount(flat, minlength=terms.n_regions) > terms.sizes).any():
            continue
        plan = np.array(flat).reshape(stages, replicas)
        out.append((terms.assignment_seconds(plan), terms.path_seconds(plan.T).max()))
    return np.array(out)


CASES = [([3, 3], 2, 3), ([2, 3, 1], 2, 3), ([4, 2], 3, 2), ([3, 2, 2], 3, 2), ([2, 2, 3], 2, 3), ([5, 3], 2, 3)]
"""(sizes, S, R): all devices used (crossings forced by sizes that are not multiples of S), and spare ones."""


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("sizes,stages,replicas", CASES)
def test_path_staircase_and_pp_floor_hold_against_brute_force(sizes, stages, replicas, seed):
    terms = _random_terms(np.random.default_rng([seed, *sizes, stages]), sizes)
    plans = _all_plans(terms, stages, replicas)
    best, least_pp = plans[:, 0].min(), plans[:, 1].min()
    assert pp_floor(terms, stages, replicas) <= least_pp + 1e-9
    for upper in (best, 1.4 * best):
        result = path_staircase_bound(terms, stages, replicas, upper, time_limit_s=5.0, piece_paths=(2, 4, 8))
        assert result.bound_s <= best + 1e-6
        # the split: a plan below it costs at least below_s
        low = plans[plans[:, 1] < result.split_s - 1e-9]
        assert (low[:, 0] >= min(result.below_s, upper) - 1e-6).all()


def test_pp_floor_is_the_cheapest_crossing_when_sizes_force_one():
    # two regions of 3 devices, S = 2, R = 3: a replica inside one region takes 2 of its devices,
    # so some replica crosses (10 s) although the cheapest path stays inside (1 s)
    terms = RegionTerms(sizes=np.array([3, 3]), dp_s=np.array([[0.01, 0.5], [0.5, 0.01]]),
                        pp_s=np.array([[1.0, 10.0], [10.0, 1.0]]), exact=True)
    assert cheapest_path_seconds(terms, 2) == pytest.approx(1.0)
    assert pp_floor(terms, 2, 3) == pytest.approx(10.0)
    assert _all_plans(terms, 2, 3)[:, 1].min() == pytest.approx(10.0)
    # with a spare device in each region nothing is forced
    spare = RegionTerms(sizes=np.array([4, 4]), dp_s=terms.dp_s, pp_s=terms.pp_s, exact=True)
    assert pp_floor(spare, 2, 3) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(3))
def test_crossing_path_seconds_is_the_cheapest_path_leaving_a_region(seed):
    rng = np.random.default_rng(seed)
    terms = _random_terms(rng, [2, 2, 2, 2])
    stages = 4
    paths, seconds = enumerate_paths(terms, stages, np.inf, 10**6)
    crossing = crossing_path_seconds(terms, stages)
    for g in range(terms.n_regions):
        visits = (paths == g).any(axis=1) & (paths != g).any(axis=1)
        assert crossing[g] == pytest.approx(seconds[visits].min())


def test_path_staircase_lifts_a_forced_crossing_case_to_its_optimum():
    # regions of 3 and 3 devices with S = 2, R = 3: PP >= 10 by the floor; the staircase proves the optimum
    terms = RegionTerms(sizes=np.array([3, 3]), dp_s=np.array([[0.01, 0.5], [0.5, 0.01]]),
                        pp_s=np.array([[1.0, 10.0], [10.0, 1.0]]), exact=True)
    best = _all_plans(terms, 2, 3)[:, 0].min()
    result = path_staircase_bound(terms, 2, 3, best * 1.5, time_limit_s=5.0)
    assert result.bound_s == pytest.approx(best, rel=1e-6)
