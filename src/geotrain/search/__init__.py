"""Placement search: assign (stage, replica) slots to devices to minimise a cost model."""

from geotrain.search.auto import AutoConfig, auto_search
from geotrain.search.base import (PlacementProblem, PlanCallback, ProgressCallback, SearchError, SearchMethod,
                                  SearchResult)
from geotrain.search.bounds import LowerBound, lower_bound, with_lower_bound
from geotrain.search.exact import ExactConfig, exact_search
from geotrain.search.genetic import GeneticConfig, genetic_search
from geotrain.search.hierarchical import HierarchicalConfig, hierarchical_search
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
    "AutoConfig",
    "ExactConfig",
    "GeneticConfig",
    "HierarchicalConfig",
    "Improvement",
    "LocalSearchConfig",
    "LowerBound",
    "PlacementProblem",
    "PlanCallback",
    "ProgressCallback",
    "RandomSearchConfig",
    "RegionHeuristicConfig",
    "SearchError",
    "SearchMethod",
    "SearchResult",
    "auto_search",
    "dp_local",
    "dp_local_assignment",
    "exact_search",
    "genetic_search",
    "get_method",
    "hierarchical_search",
    "improve",
    "local_search",
    "lower_bound",
    "pipeline_local",
    "pipeline_local_assignment",
    "random_assignments",
    "random_search",
    "run_search",
    "with_lower_bound",
]
