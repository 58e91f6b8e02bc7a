"""Search methods by name; `run_search` is the one entry point the CLI and benchmarks use."""

from __future__ import annotations

from typing import Any

from geotrain.search.auto import AutoConfig, auto_search
from geotrain.search.base import (PlacementProblem, PlanCallback, ProgressCallback, SearchError, SearchMethod,
                                  SearchResult)
from geotrain.search.exact import ExactConfig, exact_search
from geotrain.search.genetic import GeneticConfig, genetic_search
from geotrain.search.hierarchical import HierarchicalConfig, hierarchical_search
from geotrain.search.local_search import LocalSearchConfig, local_search
from geotrain.search.random_search import RandomSearchConfig, random_search
from geotrain.search.region_heuristics import RegionHeuristicConfig, dp_local, pipeline_local
from geotrain.search.region_paths import RegionPathsConfig, region_paths_search

SEARCH_METHODS: dict[str, SearchMethod] = {
    method.name: method
    for method in (
        SearchMethod("random", RandomSearchConfig, random_search, "best of N uniformly random assignments"),
        SearchMethod("pipeline-local", RegionHeuristicConfig, pipeline_local,
                     "whole pipelines inside regions, data parallelism across regions"),
        SearchMethod("dp-local", RegionHeuristicConfig, dp_local,
                     "each stage's data-parallel group inside a region, pipelines across regions"),
        SearchMethod("local-search", LocalSearchConfig, local_search,
                     "multi-start random swaps (sideways by default, strict=true: improvements only)"),
        SearchMethod("genetic", GeneticConfig, genetic_search,
                     "genetic algorithm: DP-group crossover, mutation, local search + re-wiring per child"),
        SearchMethod("hierarchical", HierarchicalConfig, hierarchical_search,
                     "DP groups, then pipelines by bottleneck matching between stages, iterated"),
        SearchMethod("exact", ExactConfig, exact_search,
                     "optimal plan of a region-uniform cluster (MILP, HiGHS), with its certificate"),
        SearchMethod("region-paths", RegionPathsConfig, region_paths_search,
                     "region path MILP over the cheapest region paths only (no certificate; scales past exact)"),
        SearchMethod("auto", AutoConfig, auto_search,
                     "exact when it applies and proves optimality, else the best of hierarchical and genetic",
                     reports_plans=True),
    )
}


def get_method(name: str) -> SearchMethod:
    if name not in SEARCH_METHODS:
        raise SearchError(f"unknown search method {name!r} (known: {', '.join(sorted(SEARCH_METHODS))})")
    return SEARCH_METHODS[name]


def run_search(
    name: str,
    problem: PlacementProblem,
    *,
    seed: int = 0,
    time_limit_s: float | None = None,
    progress: ProgressCallback | None = None,
    options: dict[str, Any] | None = None,
    on_plan: PlanCallback | None = None,
) -> SearchResult:
    """Run method `name` with `options` (fields of its config dataclass). `on_plan` is told each better
    plan as the search finds it (auto: every improvement; the other methods: their result, at the end)."""
    method = get_method(name)
    config = method.make_config(options)
    if method.reports_plans:
        return method.run(problem, config, seed=seed, time_limit_s=time_limit_s, progress=progress, on_plan=on_plan)
    result = method.run(problem, config, seed=seed, time_limit_s=time_limit_s, progress=progress)
    if on_plan is not None:
        on_plan(result)
    return result
