"""Placement search: assign (stage, replica) slots to devices to minimise a cost model."""

from geotrain.search.base import PlacementProblem, ProgressCallback, SearchError, SearchMethod, SearchResult
from geotrain.search.random_search import RandomSearchConfig, random_assignments, random_search
from geotrain.search.registry import SEARCH_METHODS, get_method, run_search

__all__ = [
    "SEARCH_METHODS",
    "PlacementProblem",
    "ProgressCallback",
    "RandomSearchConfig",
    "SearchError",
    "SearchMethod",
    "SearchResult",
    "get_method",
    "random_assignments",
    "random_search",
    "run_search",
]
