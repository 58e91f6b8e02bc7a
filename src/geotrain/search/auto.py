"""`auto`: the best plan the toolkit can give without the user choosing a method.

Without a time limit: `exact` first (the proven optimum, when the cluster is region-uniform and the
model pairwise); if it applies and proves its plan optimal, that is the answer; otherwise the
heuristics in `fallbacks` (default: hierarchical, then genetic), each once (fast), and the cheapest
plan is kept. Methods that do not apply (SearchError: a non-pairwise model, a cluster that is not
region-uniform...) are skipped and recorded in `details["tried"]`. With a time limit the heuristics
run first (a fifth of it each), then exact from their best plan (the rest, at most EXACT_SHARE, or
EXACT_SHARE_LARGE above EXACT_FULL_SLOTS slots: the plan's total prunes its region paths, and the
plan stays when the MILP finds nothing better), and unless exact proved its plan optimal the time
left goes to improvement rounds seeded from the best plan (`anytime`: region-path MILP,
large-neighbourhood MILPs, kicked hierarchical restarts, genetic runs). details: "found_by"
(the method or round that found the plan), "trajectory" ([seconds, best total, found by] at each
improvement), "anytime_rounds".
A model that is not pairwise but has a pairwise `surrogate` (e.g. "schedule": its "yuan" terms) is
searched on the surrogate and its finalists ranked with the real model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from geotrain.cluster.membership import restrict_cluster
from geotrain.cost.yuan import YuanCostModel
from geotrain.search.anytime import Trajectory, improve_until
from geotrain.search.base import (PlacementProblem, PlanCallback, ProgressCallback, SearchError, SearchResult,
                                  certifies)
from geotrain.search.exact import ExactConfig, exact_search
from geotrain.search.every_placement import enumerable, every_placement_search
from geotrain.search.genetic import GeneticConfig, genetic_search
from geotrain.search.hierarchical import HierarchicalConfig, hierarchical_search
from geotrain.search.local_search import LocalSearchConfig, local_search

EXACT_SHARE = 0.6
"""With a time limit, exact's share of it (its MILP proves the optimum on region-uniform clusters when
it has the time; it gives up at once elsewhere, leaving the time to the heuristics)."""

EXACT_SHARE_LARGE = 0.3
"""Exact's share above EXACT_FULL_SLOTS slots (S x R): there its path MILP is generated lazily and
found nothing better than the heuristics' plan in 60 % of the budget in every run measured
(uneven-128, uneven-256, uneven6-256 at 60 s: docs/history/placement.md), leaving the time to the rounds."""

EXACT_FULL_SLOTS = 64
"""Layouts of up to this many slots give exact EXACT_SHARE (issue 21's 8 x 8 case proves in 20-30 s)."""

_FALLBACKS = {
    "hierarchical": (HierarchicalConfig, hierarchical_search),
    "genetic": (GeneticConfig, genetic_search),
    "local-search": (LocalSearchConfig, local_search),
}


@dataclass(frozen=True)
class AutoConfig:
    """try_exact: attempt the MILP first; fallbacks: heuristics run when exact does not settle it
    (names among hierarchical, genetic, local-search; on the CLI comma-separated), each with its
    default options; anytime: with a time limit, spend what they leave on `anytime` rounds."""

    try_exact: bool = True
    fallbacks: tuple[str, ...] = ("hierarchical", "genetic")
    anytime: bool = True

    def __post_init__(self) -> None:
        fallbacks = tuple(self.fallbacks.split(",")) if isinstance(self.fallbacks, str) else tuple(self.fallbacks)
        unknown = [name for name in fallbacks if name not in _FALLBACKS]
        if unknown or not (fallbacks or self.try_exact):
            raise SearchError(f"auto: fallbacks must be names among {', '.join(_FALLBACKS)} "
                              f"(at least one, or try_exact), got {self.fallbacks!r}")
        object.__setattr__(self, "fallbacks", fallbacks)


def _rank_on_surrogate(problem: PlacementProblem, config: AutoConfig, *, seed: int, time_limit_s: float | None,
                       progress: ProgressCallback | None) -> SearchResult:
    """For a model that is not pairwise but offers a pairwise `surrogate` (its communication terms):
    search on the surrogate, then rank the finalists (every method's plan and the two region
    heuristics) with the real model. The surrogate's bound does not bound the real model: none."""
    from geotrain.search.region_heuristics import RegionHeuristicConfig, dp_local, pipeline_local

    start = time.perf_counter()
    surrogate = PlacementProblem(problem.cluster, problem.cost_model.surrogate)
    first = auto_search(surrogate, config, seed=seed, time_limit_s=time_limit_s, progress=progress)
    finalists = [("auto(" + first.details["chosen"] + ")", first.assignment)]
    fastest = _fastest_devices(problem)
    on_fastest = None
    if fastest is not None:  # the region heuristics again on the fastest devices alone, mapped back
        sub = restrict_cluster(problem.cluster, fastest)
        on_fastest = PlacementProblem(sub, YuanCostModel(sub, surrogate.cost_model.traffic))
    for name, run in (("pipeline-local", pipeline_local), ("dp-local", dp_local)):
        for label, searched, devices in ((name, surrogate, None), (f"{name}(fastest)", on_fastest, fastest)):
            if searched is None:
                continue
            try:
                assignment = run(searched, RegionHeuristicConfig(max_candidates=200)).assignment
            except SearchError:
                continue
            finalists.append((label, assignment if devices is None else devices[assignment]))
    scored = [(problem.cost_model.evaluate(a), name, a) for name, a in finalists]
    cost, name, assignment = min(scored, key=lambda item: item[0].total)
    details = {"chosen": name, "surrogate": problem.cost_model.surrogate.name, "tried": first.details["tried"],
               "finalists": {n: c.total for c, n, _ in scored}}
    return SearchResult(method="auto", assignment=assignment, cost=cost, seconds=time.perf_counter() - start,
                        evaluations=first.evaluations + len(scored), details=details)


def _fastest_devices(problem: PlacementProblem) -> np.ndarray | None:
    """The devices at least as fast as the (S x R)-th fastest by the real model's per-device compute seconds
    (`forward_s`, the models with compute), ascending; None where every device qualifies (one speed) or the
    model has no compute. The surrogate sees links only, so its plans may put a layout on slow GPUs beside
    idle fast ones (a 1 x 3 layout on L4s next to a site of H100s): its heuristics on these devices alone
    give the ranking a finalist that uses the fast ones."""
    forward_s = getattr(problem.cost_model, "forward_s", None)
    if forward_s is None or np.ndim(forward_s) != 1 or len(forward_s) != problem.cluster.n_devices:
        return None
    slots = problem.stages * problem.replicas
    threshold = np.sort(forward_s)[slots - 1]
    keep = np.flatnonzero(forward_s <= threshold)
    return None if len(keep) == problem.cluster.n_devices else keep


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.perf_counter())


def auto_search(
    problem: PlacementProblem,
    config: AutoConfig,
    *,
    seed: int,
    time_limit_s: float | None = None,
    progress: ProgressCallback | None = None,
    on_plan: PlanCallback | None = None,
) -> SearchResult:
    """Exact when it applies and proves optimality, else the best of the fallback heuristics; with a
    time limit (and config.anytime) the time they leave goes to `anytime.improve_until`. `on_plan` is
    told every new best plan as it is found (on the pairwise path; the surrogate path's final plan only). A problem
    with few placements (search/every_placement.py) of a model that is not pairwise (exact does not apply) is solved
    by scoring them all: optimal by enumeration."""
    if problem.cost_model.pairwise_terms() is None and enumerable(problem):
        result = every_placement_search(problem)
        result = SearchResult(method="auto", assignment=result.assignment, cost=result.cost, seconds=result.seconds,
                              evaluations=result.evaluations, lower_bound=result.lower_bound,
                              details={"chosen": "every-placement", "found_by": "every-placement",
                                       "tried": [{"method": "every-placement", "total": result.cost.total,
                                                  "seconds": result.seconds, **result.details}],
                                       "trajectory": [[result.seconds, result.cost.total, "every-placement"]],
                                       "anytime_rounds": {}, "lower_bound_source": "every-placement"})
        if on_plan is not None:
            on_plan(result)
        return result
    if problem.cost_model.pairwise_terms() is None and getattr(problem.cost_model, "surrogate", None) is not None:
        ranked = _rank_on_surrogate(problem, config, seed=seed, time_limit_s=time_limit_s, progress=progress)
        if on_plan is not None:
            on_plan(ranked)
        return ranked
    start = time.perf_counter()
    deadline = None if time_limit_s is None else start + time_limit_s
    anytime = config.anytime and deadline is not None
    trajectory = Trajectory(start, listener=on_plan)
    tried: list[dict] = []
    results: list[SearchResult] = []
    candidates = [(name, *_FALLBACKS[name]) for name in config.fallbacks]
    exact = [("exact", ExactConfig, exact_search)] if config.try_exact else []
    # without a limit exact goes first (it may settle everything at once); with one the heuristics do,
    # and exact starts from their best plan (it prunes the region paths, and stays if nothing beats it)
    candidates = exact + candidates if not anytime else candidates + exact
    exact_share = EXACT_SHARE if problem.stages * problem.replicas <= EXACT_FULL_SLOTS else EXACT_SHARE_LARGE
    for k, (name, config_type, run) in enumerate(candidates):
        # anytime: exact may take EXACT_SHARE of the budget, each heuristic a fifth; the rest goes to the rounds
        share = None if deadline is None else (_remaining(deadline) if not anytime else
                                               min(_remaining(deadline), time_limit_s * (exact_share if name == "exact"
                                                                                         else 0.2)))
        seeded = {"initial": trajectory.best.assignment} if name == "exact" and trajectory.best is not None else {}
        try:
            result = run(problem, config_type(), seed=seed, time_limit_s=share, progress=progress, **seeded)
        except SearchError as exc:
            tried.append({"method": name, "skipped": str(exc)})
            continue
        tried.append({"method": name, "total": result.cost.total, "seconds": result.seconds})
        results.append(result)
        trajectory.offer(result, name)
        if result.proven_optimal or (deadline is not None and _remaining(deadline) == 0.0):
            break
    if not results:
        reasons = "; ".join(f"{t['method']}: {t['skipped']}" for t in tried)
        raise SearchError(f"auto: no method applies to this problem ({reasons})")
    bounds = [r.lower_bound for r in results if r.lower_bound is not None]
    bound = max(bounds) if bounds else None
    rounds: dict[str, int] = {}
    if anytime and not (bound is not None and certifies(trajectory.best.cost.total, bound)):
        rounds = improve_until(problem, trajectory, seed=seed, deadline=deadline, budget_s=time_limit_s)
    best = trajectory.best
    details = {"chosen": trajectory.found_by.split("#")[0], "found_by": trajectory.found_by, "tried": tried,
               "trajectory": trajectory.to_json(), "anytime_rounds": rounds}
    if bounds:
        details["lower_bound_source"] = next(r.method for r in results if r.lower_bound == bound)
    return SearchResult(
        method="auto",
        assignment=best.assignment,
        cost=best.cost,
        seconds=time.perf_counter() - start,
        evaluations=sum(r.evaluations for r in results),
        details=details,
        lower_bound=bound,
    )
