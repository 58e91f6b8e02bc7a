"""`region-paths`: the region path MILP restricted to the cheapest region paths (a heuristic).

Where `exact` has too many candidate region paths, the best plan whose replicas follow only the P
cheapest region paths is still a plan, and good ones rarely need dear paths. For each P in
`path_counts` the path MILP (`milp.solve_path_milp`, region terms of `regions`) runs with an even
share of the time limit; each solution is expanded to devices (`regions.expand_to_devices`), its
pipelines re-wired over the real links (`wiring.rewire`: never slower; on clusters that are not
region-uniform it picks better device chains), and the cheapest plan under the real model is kept.
No certificate: the paths left out may hold better plans (`plan --lower-bound` says how far it can be).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


from geotrain.search.base import PlacementProblem, ProgressCallback, SearchError, SearchResult
from geotrain.search.exact import _cheapest_paths
from geotrain.search.milp import solve_path_milp
from geotrain.search.regions import expand_to_devices, pairwise_or_fail, region_terms
from geotrain.search.wiring import rewire

DEFAULT_TIME_LIMIT_S = 30.0
"""Time for all the MILPs together when the search has no time limit."""


@dataclass(frozen=True)
class RegionPathsConfig:
    """path_counts: how many of the cheapest region paths each MILP may use."""

    path_counts: tuple[int, ...] = (40, 80, 160, 640)

    def __post_init__(self) -> None:
        counts = tuple(self.path_counts) if isinstance(self.path_counts, (list, tuple)) else (self.path_counts,)
        if not counts or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts):
            raise SearchError(f"region-paths: path_counts must be integers >= 1, got {self.path_counts!r}")
        object.__setattr__(self, "path_counts", counts)


def region_paths_search(problem: PlacementProblem, config: RegionPathsConfig, *, seed: int,
                        time_limit_s: float | None = None, progress: ProgressCallback | None = None) -> SearchResult:
    """Best plan over the restricted path MILPs (see the module docstring); `seed` is unused (HiGHS is
    deterministic for a given model)."""
    start = time.perf_counter()
    model = problem.cost_model
    pp_pair = pairwise_or_fail(model, "region-paths").pp_pair_s
    terms = region_terms(problem.cluster, model, "region-paths")
    S, R = problem.stages, problem.replicas
    budget = DEFAULT_TIME_LIMIT_S if time_limit_s is None else float(time_limit_s)
    best, tried, seen = None, [], set()
    for k, count in enumerate(config.path_counts):
        found = _cheapest_paths(terms, S, count, max(count, 20000))
        if found is None or min(count, len(found[0])) in seen:
            continue
        paths, path_s = found[0][:count], found[1][:count]
        seen.add(len(paths))
        left = budget - (time.perf_counter() - start)
        if left <= 0:
            break
        milp = solve_path_milp(terms, S, R, paths, path_s, left / (len(config.path_counts) - k))
        tried.append({"paths": int(len(paths)), "status": milp.status, "region_objective": milp.objective})
        if milp.stage_paths is not None:
            assignment = rewire(pp_pair, expand_to_devices(problem.cluster, milp.stage_paths))
            cost = model.evaluate(assignment)
            tried[-1]["total"] = cost.total
            if best is None or cost.total < best[0].total:
                best = (cost, assignment)
        if progress is not None:
            progress(k + 1, len(config.path_counts))
    if best is None:
        raise SearchError(f"region-paths: no MILP found a plan within the time limit ({budget:g} s)")
    return SearchResult(method="region-paths", assignment=best[1], cost=best[0], seconds=time.perf_counter() - start,
                        evaluations=len(tried), details={"milps": tried})
