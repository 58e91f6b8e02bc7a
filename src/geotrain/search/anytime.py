"""Spend what is left of a time limit improving the best plan so far (`auto`'s second phase).

Rounds cycle through four moves, each seeded from the best plan so far and given a slice of the
time left (at most a sixth of the whole budget, at least SLICE_MIN_S):
- "region-paths" (once, pairwise models): the path MILP over the cheapest region paths
  (`region_paths`), expanded to devices and re-wired on the real links;
- "lns" (pairwise models): large-neighbourhood search (`neighbourhood`): most of the best plan
  kept, a few stages or regions re-solved exactly by the path MILP started from the plan;
- "hierarchical-kick": iterated local search: the best plan with a few random swaps (about a tenth
  of its slots; `genetic.mutate`) is the single start of `hierarchical`;
- "genetic": a new population (new seed) holding the best plan, run until its slice ends.
Round k draws from seed [seed, k]; same seed and same machine speed, same plan (the slices are
timed, so a loaded machine may end a round earlier). Every improvement is recorded as a
(seconds since the search started, total) point of the trajectory, with the move that found it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from geotrain.search.base import PlacementProblem, PlanCallback, SearchError, SearchResult
from geotrain.search.genetic import GeneticConfig, genetic_search, mutate
from geotrain.search.hierarchical import HierarchicalConfig, hierarchical_search
from geotrain.search.neighbourhood import NeighbourhoodConfig, lns_search
from geotrain.search.region_paths import RegionPathsConfig, region_paths_search

SLICE_MIN_S = 2.0
"""Shortest slice of a round (seconds): below it a round is not started."""


@dataclass
class Trajectory:
    """The best plan so far and how it improved: points [(seconds, total)], found_by per point;
    `listener` is told each new best plan as it is found."""

    start: float
    best: SearchResult | None = None
    found_by: str = ""
    points: list[tuple[float, float]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    listener: PlanCallback | None = None

    def offer(self, result: SearchResult, label: str) -> bool:
        """Keep `result` if it beats the best so far (relative 1e-12); True when it did."""
        if self.best is not None and result.cost.total >= self.best.cost.total * (1 - 1e-12):
            return False
        self.best, self.found_by = result, label
        self.points.append((time.perf_counter() - self.start, float(result.cost.total)))
        self.labels.append(label)
        if self.listener is not None:
            self.listener(result)
        return True

    def to_json(self) -> list[list]:
        return [[round(t, 3), total, label] for (t, total), label in zip(self.points, self.labels)]


def _moves(problem: PlacementProblem) -> list[str]:
    pairwise = problem.cost_model.pairwise_terms() is not None
    return ["region-paths", "lns", "hierarchical-kick", "lns", "genetic"] if pairwise else ["genetic"]


def improve_until(problem: PlacementProblem, trajectory: Trajectory, *, seed: int, deadline: float,
                  budget_s: float) -> dict[str, int]:
    """Run rounds (module docstring) until `deadline` (time.perf_counter()); returns rounds per move."""
    assert trajectory.best is not None
    S, R, N = problem.stages, problem.replicas, problem.n_devices
    moves = _moves(problem)
    rounds: dict[str, int] = {}
    k = 0
    while True:
        left = deadline - time.perf_counter()
        slice_s = min(left, max(SLICE_MIN_S, budget_s / 6.0))
        if slice_s < SLICE_MIN_S or not moves:
            break
        move = moves[k % len(moves)]
        k += 1
        best = trajectory.best.assignment
        rng = np.random.default_rng([seed, k])
        try:
            if move == "region-paths":
                moves.remove(move)
                result = region_paths_search(problem, RegionPathsConfig(), seed=seed, time_limit_s=slice_s)
            elif move == "lns":
                result = lns_search(problem, NeighbourhoodConfig(), initial=best, rng=rng, time_limit_s=slice_s)
            elif move == "hierarchical-kick":
                kicked = mutate(best, N, max(2, S * R // 10), rng)
                result = hierarchical_search(problem, HierarchicalConfig(starts=1, structured_starts=False),
                                             seed=seed + k, time_limit_s=slice_s, initial=kicked)
            else:
                result = genetic_search(problem, GeneticConfig(children=10**9), seed=seed + k,
                                        time_limit_s=slice_s, initial=best)
        except SearchError:
            continue
        rounds[move] = rounds.get(move, 0) + 1
        trajectory.offer(result, f"{move}#{k}")
    return rounds
