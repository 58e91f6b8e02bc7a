"""`exact`: the optimal placement of a region-uniform cluster, with a certificate (MILP gap 0).

With devices identical inside each region, a placement is characterised by region counts per stage
and a region path per replica; `milp.solve_path_milp` optimises over those. The number of region
paths (G^S) is cut down without losing optimality: a path can only be used by an optimal plan if
its seconds are <= U - DP_min, where U is the total of any feasible plan and DP_min <= every plan's
dp (`regions.dp_floor`: the (S R)-th smallest per-device sum of R - 1 cheapest pairs). U comes from the same MILP restricted to the cheapest paths (any of its solutions is feasible).
If even the pruned set has more than `max_paths` paths, the paths are generated lazily (cheapest
first, `solve_region_problem`): the plan then comes with the bound min(B_c, c + DPlb) instead of
a certificate, unless that bound reaches it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from geotrain.search.base import PlacementProblem, ProgressCallback, SearchError, SearchResult
from geotrain.search.milp import MilpResult, solve_path_milp
from geotrain.search.regions import (
    RegionTerms,
    cheapest_path_seconds,
    dp_floor,
    enumerate_paths,
    expand_to_devices,
    region_terms,
)


WARM_LIMIT_S = 10.0
"""Time for the MILP over the cheapest paths when no time limit is given (it only lowers U)."""


@dataclass(frozen=True)
class ExactConfig:
    """max_paths: give up (clear error) above this many candidate region paths; time_limit_s of
    the MILP solves comes from the search's time limit (default: none)."""

    max_paths: int = 20000

    def __post_init__(self) -> None:
        if isinstance(self.max_paths, bool) or not isinstance(self.max_paths, int) or self.max_paths < 1:
            raise SearchError(f"exact: max_paths must be an integer >= 1, got {self.max_paths!r}")


@dataclass(frozen=True)
class RegionSolution:
    """The region-level result: `milp` (its status, objective, bound, stage_paths), the number of
    candidate paths, the upper bound U used to prune them, whether all needed paths were kept,
    bound_s: a proven lower bound on the region problem's optimum (seconds, valid also when
    incomplete: see `solve_region_problem`), path_cap_s: the dearest path cost the MILP held."""

    milp: MilpResult
    paths: int
    upper_bound_s: float
    complete: bool
    bound_s: float = 0.0
    path_cap_s: float = np.inf


def _cheapest_paths(terms: RegionTerms, stages: int, count: int, max_paths: int) -> tuple[np.ndarray, np.ndarray] | None:
    """At least `count` of the cheapest region paths when that many exist within max_paths."""
    base = cheapest_path_seconds(terms, stages)
    span = max(float(terms.pp_s.max()) * max(stages - 1, 1), 1e-9)
    best = enumerate_paths(terms, stages, base, max_paths)
    step = span / 256
    while best is not None and len(best[0]) < count and step <= 2 * span:
        found = enumerate_paths(terms, stages, base + step, max_paths)
        if found is None:
            break
        best, step = found, step * 2
    return best


def simple_upper_bound(terms: RegionTerms, stages: int, replicas: int) -> float:
    """Total (region terms) of the better of two feasible plans on devices sorted by region:
    consecutive devices form pipelines, or consecutive devices form DP groups."""
    regions = np.repeat(np.arange(terms.n_regions), terms.sizes)[: stages * replicas]
    pipelines = regions.reshape(replicas, stages).T
    groups = regions.reshape(stages, replicas)
    return min(terms.assignment_seconds(pipelines), terms.assignment_seconds(groups))


def paths_below(terms: RegionTerms, stages: int, cap_s: float, max_paths: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Every region path of cost <= c and their seconds, cheapest first, for the largest c <= cap_s
    (found by bisection) that keeps them within `max_paths` (at least the cheapest paths' cost)."""
    low = cheapest_path_seconds(terms, stages)
    found = enumerate_paths(terms, stages, cap_s, max_paths)
    if found is not None:
        return found[0], found[1], float(cap_s)
    best = enumerate_paths(terms, stages, low, 10 * max_paths)
    if best is None:  # more ties at the cheapest cost than allowed: keep them all the same
        best = enumerate_paths(terms, stages, low, 10**9)
    high = float(cap_s)
    for _ in range(30):
        if high - low <= 1e-6 * max(high, 1.0):
            break
        middle = 0.5 * (low + high)
        found = enumerate_paths(terms, stages, middle, max_paths)
        if found is None:
            high = middle
        else:
            best, low = found, middle
    return best[0], best[1], float(low)


def dp_lower_bound(terms: RegionTerms, stages: int, replicas: int, upper_s: float, time_limit_s: float) -> float:
    """A lower bound on the DP of every plan with total <= upper_s (seconds): the larger of
    `dp_floor` and the cut-flow MILP's least DP (`staircase.solve_dp_flow_milp`, no pipeline cap)
    over plans with DP <= upper_s - cheapest path, capped at that value. Proof: such a plan has
    PP >= the cheapest path, so its DP <= upper_s - cheapest path; the MILP relaxes those plans."""
    from geotrain.search.staircase import solve_dp_flow_milp

    floor = dp_floor(terms, replicas, stages)
    cap = upper_s - cheapest_path_seconds(terms, stages)
    if stages < 2 or replicas < 2 or cap <= floor:
        return floor
    result = solve_dp_flow_milp(terms, stages, replicas, np.inf, max(0.1, time_limit_s), dp_cap_s=cap)
    return max(floor, min(result.bound, cap))


def solve_region_problem(terms: RegionTerms, stages: int, replicas: int, *, max_paths: int = 20000,
                         time_limit_s: float | None = None, upper_bound_s: float | None = None) -> RegionSolution:
    """Optimise the region-level problem (exactly, if `complete` and status optimal).

    `upper_bound_s`: the total of a known feasible plan under these terms (or above them), to prune
    paths. An optimal plan uses only paths of cost <= U - DPlb (DPlb: `dp_lower_bound`, <= its DP).
    When that leaves more than `max_paths`, paths are generated lazily: the MILP runs over every path
    of cost <= c (`paths_below`, c as large as max_paths allows). Its plan lowers U (and so the paths
    needed); when they still are too many the result is incomplete, with the bound
        OPT >= min(B_c, c + DPlb)                                                      (bound_s)
    Proof: a plan whose replicas all cost <= c is a point of the restricted MILP, so its total is
    >= B_c (that MILP's dual bound); any other plan has a replica above c, so PP > c and DP >= DPlb.
    """
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    left = lambda share, fallback: fallback if deadline is None else max(0.1, share * (deadline - time.perf_counter()))  # noqa: E731
    upper = simple_upper_bound(terms, stages, replicas)
    if upper_bound_s is not None:
        upper = min(upper, float(upper_bound_s))
    dp_low = dp_floor(terms, replicas, stages)
    found = enumerate_paths(terms, stages, upper - dp_low, max_paths)
    if found is None:
        dp_low = dp_lower_bound(terms, stages, replicas, upper, left(0.1, WARM_LIMIT_S / 2))
        found = enumerate_paths(terms, stages, upper - dp_low, max_paths)
    if found is None:
        allowed = max_paths
        while True:  # too few paths may hold no plan (capacities): allow 4 x more until one does
            paths, path_s, cap = paths_below(terms, stages, upper - dp_low, allowed)
            warm = solve_path_milp(terms, stages, replicas, paths, path_s, left(0.5, WARM_LIMIT_S))
            if warm.status != "infeasible" or cap >= upper - dp_low or allowed >= 64 * max_paths:
                break
            allowed *= 4
        if warm.objective is not None and warm.objective < upper:
            upper = warm.objective
            found = enumerate_paths(terms, stages, upper - dp_low, max_paths)
        if found is None:
            bound = min(warm.bound, cap + dp_low, upper)
            return RegionSolution(warm, len(paths), upper, complete=False, bound_s=bound, path_cap_s=cap)
    final_limit_s = None if deadline is None else max(0.1, deadline - time.perf_counter())
    result = solve_path_milp(terms, stages, replicas, found[0], found[1], final_limit_s)
    return RegionSolution(result, len(found[0]), upper, complete=True, bound_s=min(result.bound, upper),
                          path_cap_s=upper - dp_low)


def exact_search(
    problem: PlacementProblem,
    config: ExactConfig,
    *,
    seed: int,
    time_limit_s: float | None = None,
    progress: ProgressCallback | None = None,
    initial: np.ndarray | None = None,
) -> SearchResult:
    """Optimal plan of a region-uniform cluster under a pairwise model; `lower_bound` is the MILP bound
    (equal to the total, up to solver tolerance, when status is optimal). `initial`: a known plan
    (`auto` passes its heuristics' best): its total prunes the region paths (on exact region terms it
    is its region total, >= the optimum), and it is returned, with the MILP's bound, when the MILP
    finds nothing better in time."""
    start = time.perf_counter()
    cluster, model = problem.cluster, problem.cost_model
    terms = region_terms(cluster, model, "exact")
    if not terms.exact:
        raise SearchError("exact needs a region-uniform cluster (every device pair's link set by its two regions); "
                          "use another method, and --lower-bound for a bound")
    known = None if initial is None else (np.asarray(initial, dtype=np.int64), model.evaluate(initial))
    solution = solve_region_problem(terms, problem.stages, problem.replicas, max_paths=config.max_paths,
                                    time_limit_s=time_limit_s, upper_bound_s=None if known is None else known[1].total)
    milp = solution.milp
    if milp.stage_paths is None and known is None:
        raise SearchError(f"exact: the MILP found no plan within the time limit ({milp.status})")
    assignment = known[0] if milp.stage_paths is None else expand_to_devices(cluster, milp.stage_paths)
    cost = model.evaluate(assignment)
    if known is not None and known[1].total < cost.total:
        assignment, cost = known
    if progress is not None:
        progress(1, 1)
    bound = certified_bound(solution, cost.total)
    return SearchResult(
        method="exact",
        assignment=assignment,
        cost=cost,
        seconds=time.perf_counter() - start,
        evaluations=1,
        details={"status": milp.status, "proven_optimal": bound >= cost.total, "complete": solution.complete,
                 "milp_objective": milp.objective, "milp_bound": milp.bound, "candidate_paths": solution.paths,
                 "path_cap_s": solution.path_cap_s, "pruning_upper_bound": solution.upper_bound_s,
                 "milp_seconds": milp.seconds, "region_counts": None if milp.counts is None else milp.counts.tolist()},
        lower_bound=bound,
    )


def certified_bound(solution: RegionSolution, total_s: float) -> float:
    """The total itself when the region bound reaches the MILP's objective and that objective is this
    plan's total (the certificate: gap 0), else the region bound (`RegionSolution.bound_s`)."""
    milp = solution.milp
    tolerance = 1e-9 * max(total_s, 1.0)
    if milp.objective is not None and abs(milp.objective - total_s) <= tolerance and (
            (solution.complete and milp.status == "optimal") or solution.bound_s >= milp.objective - tolerance):
        return total_s
    return min(solution.bound_s, total_s)
