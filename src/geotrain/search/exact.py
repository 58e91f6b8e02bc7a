"""`exact`: the optimal placement of a region-uniform cluster, with a certificate (MILP gap 0).

With devices identical inside each region, a placement is characterised by region counts per stage
and a region path per replica; `milp.solve_path_milp` optimises over those. The number of region
paths (G^S) is cut down without losing optimality: a path can only be used by an optimal plan if
its seconds are <= U - DP_min, where U is the total of any feasible plan and DP_min <= every plan's
dp (`regions.dp_floor`: the (S R)-th smallest per-device sum of R - 1 cheapest pairs). U comes from the same MILP restricted to the cheapest paths (any of its solutions is feasible).
If even the pruned set has more than `max_paths` paths, exact reports that it does not apply
(and `geotrain plan --lower-bound` still gives a bound from the flow relaxation).
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
    candidate paths, the upper bound U used to prune them, and whether all needed paths were kept."""

    milp: MilpResult
    paths: int
    upper_bound_s: float
    complete: bool


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


def solve_region_problem(terms: RegionTerms, stages: int, replicas: int, *, max_paths: int = 20000,
                         time_limit_s: float | None = None, upper_bound_s: float | None = None) -> RegionSolution:
    """Optimise the region-level problem (exactly, if `complete` and status optimal).

    `upper_bound_s`: the total of a known feasible plan under these terms, to prune paths further.
    Paths are pruned at U - dp_floor; if that leaves more than `max_paths`, a MILP over the cheapest
    paths (a quarter of the time limit) first tries to lower U; if still too many, the result is
    that restricted MILP's, with complete=False.
    """
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    warm_limit_s = WARM_LIMIT_S if time_limit_s is None else 0.25 * time_limit_s
    upper = simple_upper_bound(terms, stages, replicas)
    if upper_bound_s is not None:
        upper = min(upper, float(upper_bound_s))
    floor = dp_floor(terms, replicas, stages)
    found = enumerate_paths(terms, stages, upper - floor, max_paths)
    warm: MilpResult | None = None
    if found is None:
        cheap = _cheapest_paths(terms, stages, max(4 * terms.n_regions, 2 * replicas, 16), max_paths)
        if cheap is not None:
            warm = solve_path_milp(terms, stages, replicas, cheap[0], cheap[1], warm_limit_s)
            if warm.objective is not None and warm.objective < upper:
                upper = warm.objective
                found = enumerate_paths(terms, stages, upper - floor, max_paths)
        if found is None:
            if warm is None or warm.objective is None:
                raise SearchError(f"exact does not apply here: more than {max_paths} candidate region paths for "
                                  f"{stages} stages over {terms.n_regions} regions (raise max_paths, or use another "
                                  f"method with --lower-bound)")
            return RegionSolution(warm, -1, upper, complete=False)
    final_limit_s = None if deadline is None else max(0.1, deadline - time.perf_counter())
    result = solve_path_milp(terms, stages, replicas, found[0], found[1], final_limit_s)
    return RegionSolution(result, len(found[0]), upper, complete=True)


def exact_search(
    problem: PlacementProblem,
    config: ExactConfig,
    *,
    seed: int,
    time_limit_s: float | None = None,
    progress: ProgressCallback | None = None,
) -> SearchResult:
    """Optimal plan of a region-uniform cluster under a pairwise model; `lower_bound` is the MILP bound
    (equal to the total, up to solver tolerance, when status is optimal)."""
    start = time.perf_counter()
    cluster, model = problem.cluster, problem.cost_model
    terms = region_terms(cluster, model, "exact")
    if not terms.exact:
        raise SearchError("exact needs a region-uniform cluster (every device pair's link set by its two regions); "
                          "use another method, and --lower-bound for a bound")
    solution = solve_region_problem(terms, problem.stages, problem.replicas, max_paths=config.max_paths,
                                    time_limit_s=time_limit_s)
    if not solution.complete:
        raise SearchError(f"exact does not apply here: more than {config.max_paths} candidate region paths "
                          f"for {problem.stages} stages over {terms.n_regions} regions (raise max_paths, or use "
                          f"another method with --lower-bound)")
    milp = solution.milp
    if milp.stage_paths is None:
        raise SearchError(f"exact: the MILP found no plan within the time limit ({milp.status})")
    assignment = expand_to_devices(cluster, milp.stage_paths)
    cost = model.evaluate(assignment)
    if progress is not None:
        progress(1, 1)
    return SearchResult(
        method="exact",
        assignment=assignment,
        cost=cost,
        seconds=time.perf_counter() - start,
        evaluations=1,
        details={"status": milp.status, "proven_optimal": milp.status == "optimal",
                 "milp_objective": milp.objective, "milp_bound": milp.bound, "candidate_paths": solution.paths,
                 "pruning_upper_bound": solution.upper_bound_s, "milp_seconds": milp.seconds,
                 "region_counts": milp.counts.tolist()},
        lower_bound=certified_bound(milp, cost.total),
    )


def certified_bound(milp: MilpResult, total_s: float) -> float:
    """The total itself when the MILP is proven optimal and its objective is this plan's total (the
    certificate: gap 0), else the MILP's (deflated) dual bound."""
    if milp.status == "optimal" and milp.objective is not None and abs(milp.objective - total_s) <= 1e-9 * max(total_s, 1.0):
        return total_s
    return min(milp.bound, total_s)
