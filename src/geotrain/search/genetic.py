"""`genetic`: a steady-state genetic algorithm over placements, in the spirit of Yuan et al. (NeurIPS
2022), whose scheduler is a hybrid genetic algorithm with a problem-specific local search.

- Population: random placements (optionally also the two `hierarchical.metric_starts`).
- Crossover keeps DP groups whole: the 2S groups of two parents are taken in a random order biased
  to cheap groups (dp x U(0.5, 1.5)) while they do not clash with groups already taken; missing
  groups are rebuilt from the parent group with most free devices, completed with the free devices
  cheapest to its members. Then the pipelines are re-wired for the new groups (`wiring.rewire`).
- Mutation: `mutation_swaps` random swaps (slot/slot or slot/unused device), with prob. `mutation_rate`.
- Local search on every child: `local_search.improve` (incremental swap search, sideways), then rewire.
- Replacement: a child replaces the worst member if it is better and no member has the same total.
Non-pairwise models work too: "yuan+compute" is guided by its communication terms (and its structured
starts use the fastest GPUs); for ring and dtfm groups are taken in random order without re-wiring.
The local search then evaluates every swap with the model in full. Same seed, same result unless the time
limit cuts the run short.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from geotrain.search.base import PlacementProblem, ProgressCallback, SearchError, SearchResult
from geotrain.search.hierarchical import metric_starts
from geotrain.search.local_search import improve
from geotrain.search.wiring import rewire

REL_TOL = 1e-12


@dataclass(frozen=True)
class GeneticConfig:
    """population: members; children: offspring produced in all (the budget); tournament: size of
    parent selection; mutation_rate, mutation_swaps: how often / how much a child is mutated;
    improve_swaps: swap proposals of the local search on each child; structured_starts: seed the
    population with the two metric starts of `hierarchical` as well as random placements."""

    population: int = 16
    children: int = 120
    tournament: int = 3
    mutation_rate: float = 0.5
    mutation_swaps: int = 3
    improve_swaps: int = 2000
    structured_starts: bool = True

    def __post_init__(self) -> None:
        for key, low in (("population", 2), ("children", 0), ("tournament", 1), ("mutation_swaps", 0), ("improve_swaps", 0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise SearchError(f"genetic: {key} must be an integer >= {low}, got {value!r}")
        if not 0.0 <= self.mutation_rate <= 1.0:
            raise SearchError(f"genetic: mutation_rate must be in [0, 1], got {self.mutation_rate!r}")
        if not isinstance(self.structured_starts, bool):
            raise SearchError(f"genetic: structured_starts must be true or false, got {self.structured_starts!r}")


class _Scorer:
    """Totals, group dp and re-wiring for one problem. Pairwise terms guide crossover and re-wiring:
    the model's own, or, for a model that adds compute to "yuan" (`comm` attribute), its
    communication part; totals always come from the model itself."""

    def __init__(self, problem: PlacementProblem) -> None:
        self.model = problem.cost_model
        terms = self.model.pairwise_terms()
        if terms is None and hasattr(self.model, "comm"):
            terms = self.model.comm.pairwise_terms()
        self.dp_pair = None if terms is None else np.ascontiguousarray(terms.dp_pair_s)
        self.pp_pair = None if terms is None else np.ascontiguousarray(terms.pp_pair_s)

    def structured_starts(self, stages: int, replicas: int) -> list[np.ndarray]:
        """`metric_starts` on the devices with the least compute time per slot (all devices when the
        model has no per-device compute), mapped back to device indices."""
        if self.dp_pair is None:
            return []
        slot_seconds = getattr(self.model, "slot_seconds", None)
        n = self.dp_pair.shape[0]
        keep = np.arange(n) if slot_seconds is None else np.sort(np.argsort(slot_seconds, kind="stable")[: stages * replicas])
        starts = metric_starts(self.dp_pair[np.ix_(keep, keep)], self.pp_pair[np.ix_(keep, keep)], stages, replicas)
        return [keep[start] for start in starts]

    def total(self, assignment: np.ndarray) -> float:
        return float(self.model.evaluate_many(assignment[None])[0])

    def group_dp(self, groups: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """dp (s) of each group (row), or random priorities for non-pairwise models."""
        if self.dp_pair is None:
            return rng.random(len(groups))
        return self.dp_pair[groups[:, :, None], groups[:, None, :]].sum(axis=-1).max(axis=-1)

    def rewire(self, assignment: np.ndarray) -> np.ndarray:
        return assignment if self.pp_pair is None else rewire(self.pp_pair, assignment)


def crossover(scorer: _Scorer, a: np.ndarray, b: np.ndarray, n_devices: int, rng: np.random.Generator) -> np.ndarray:
    """A child made of whole DP groups of the parents where possible (see the module docstring)."""
    S, R = a.shape
    groups = np.concatenate([a, b])
    priority = scorer.group_dp(groups, rng) * rng.uniform(0.5, 1.5, size=len(groups))
    free = np.ones(n_devices, dtype=bool)
    child: list[np.ndarray] = []
    for g in np.argsort(priority, kind="stable"):
        if len(child) == S:
            break
        if free[groups[g]].all():
            child.append(groups[g].copy())
            free[groups[g]] = False
    while len(child) < S:
        kept_counts = free[groups].sum(axis=1)
        g = int(np.argmax(kept_counts + rng.random(len(groups)) * 0.5))
        members = [int(d) for d in groups[g] if free[d]]
        free[members] = False
        while len(members) < R:
            candidates = np.flatnonzero(free)
            if scorer.dp_pair is not None and members:
                pick = int(candidates[np.argmin(scorer.dp_pair[np.ix_(candidates, members)].sum(axis=1))])
            else:
                pick = int(rng.choice(candidates))
            members.append(pick)
            free[pick] = False
        child.append(np.array(members, dtype=np.int64))
    return np.stack(child)


def mutate(assignment: np.ndarray, n_devices: int, swaps: int, rng: np.random.Generator) -> np.ndarray:
    """`swaps` random swaps of a slot with another slot or with an unused device."""
    S, R = assignment.shape
    order = np.concatenate([assignment.ravel(), np.setdiff1d(np.arange(n_devices), assignment.ravel())])
    for _ in range(swaps):
        i = int(rng.integers(0, S * R))
        j = int(rng.integers(0, n_devices - 1))
        j += j >= i
        order[i], order[j] = order[j], order[i]
    return order[: S * R].reshape(S, R)


def genetic_search(
    problem: PlacementProblem,
    config: GeneticConfig,
    *,
    seed: int,
    time_limit_s: float | None = None,
    progress: ProgressCallback | None = None,
    initial: np.ndarray | None = None,
) -> SearchResult:
    """Steady-state GA with DP-group crossover, mutation and a local search per child; `initial`: an
    (S, R) plan that joins the population first (`auto` seeds later runs with its best so far)."""
    start = time.perf_counter()
    deadline = None if time_limit_s is None else start + time_limit_s
    S, R, N = problem.stages, problem.replicas, problem.n_devices
    if N < 2:
        raise SearchError("genetic needs at least 2 devices")
    rng = np.random.default_rng(seed)
    scorer = _Scorer(problem)
    model = problem.cost_model
    starts = ([np.asarray(initial, dtype=np.int64)] if initial is not None else []) + \
        (scorer.structured_starts(S, R) if config.structured_starts else [])
    while len(starts) < config.population:
        starts.append(rng.permutation(N)[: S * R].reshape(S, R))
    members: list[np.ndarray] = []
    totals: list[float] = []
    evaluations = 0
    for assignment in starts[: config.population]:
        if members and time_limit_s is not None and time.perf_counter() - start > time_limit_s:
            break  # a smaller population, but the time limit holds
        assignment = scorer.rewire(improve(model, scorer.rewire(assignment), config.improve_swaps, rng=rng, deadline=deadline).assignment)
        members.append(assignment)
        totals.append(scorer.total(assignment))
        evaluations += config.improve_swaps + 1
    history = [min(totals)]
    accepted = 0
    made = 0
    timed_out = time_limit_s is not None and time.perf_counter() - start > time_limit_s
    while made < config.children and not timed_out:
        made += 1
        parents = []
        for _ in range(2):
            picks = rng.integers(0, len(members), size=config.tournament)
            parents.append(members[int(picks[np.argmin([totals[p] for p in picks])])])
        child = crossover(scorer, parents[0], parents[1], N, rng)
        if rng.random() < config.mutation_rate:
            child = mutate(child, N, config.mutation_swaps, rng)
        child = scorer.rewire(child)
        child = scorer.rewire(improve(model, child, config.improve_swaps, rng=rng, deadline=deadline).assignment)
        total = scorer.total(child)
        evaluations += config.improve_swaps + 1
        worst = int(np.argmax(totals))
        clone = any(abs(total - t) <= REL_TOL * max(t, 1.0) for t in totals)
        if total < totals[worst] * (1 - REL_TOL) and not clone:
            members[worst], totals[worst] = child, total
            accepted += 1
        history.append(min(totals))
        if progress is not None:
            progress(made, config.children)
        timed_out = time_limit_s is not None and time.perf_counter() - start > time_limit_s
    best = int(np.argmin(totals))
    return SearchResult(
        method="genetic",
        assignment=members[best],
        cost=model.evaluate(members[best]),
        seconds=time.perf_counter() - start,
        evaluations=evaluations,
        details={"children": made, "accepted": accepted, "best_history": history[:: max(1, len(history) // 20)],
                 "population_totals": sorted(totals), "timed_out": timed_out},
    )
