"""Placement search: assign (stage, replica) slots to devices to minimise a cost model."""

from geotrain.search.base import PlacementProblem, ProgressCallback, SearchError, SearchMethod, SearchResult
from geotrain.search.local_search import Improvement, LocalSearchConfig, improve, local_search
from geotrain.search.random_search import RandomSearchConfig, random_assignments, random_search
from geotrain.search.region_heuristics import (
    RegionHeuristicConfig,
    dp_local,
    dp_local_assignment,
    pipeline_local,
    pipeline_local_assignment,
)
from geotrain.search.registry import SEARCH_METHODS, get_method, run_search

__all__ = [
    "SEARCH_METHODS",
    "Improvement",
    "LocalSearchConfig",
    "PlacementProblem",
    "ProgressCallback",
    "RandomSearchConfig",
    "RegionHeuristicConfig",
    "SearchError",
    "SearchMethod",
    "SearchResult",
    "dp_local",
    "dp_local_assignment",
    "get_method",
    "improve",
    "local_search",
    "pipeline_local",
    "pipeline_local_assignment",
    "random_assignments",
    "random_search",
    "run_search",
]
