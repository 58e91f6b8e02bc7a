"""Communication cost models: score an (S, R) assignment of devices in seconds per iteration."""

from geotrain.cost.assignment import AssignmentError, as_assignment, assignment_from_order
from geotrain.cost.base import CostBreakdown, CostModel, PairwiseTerms
from geotrain.cost.reference import yuan_cost_reference
from geotrain.cost.registry import COST_MODELS, DEFAULT_COST_MODEL, CostModelError, build_cost_model
from geotrain.cost.yuan import YuanCostModel, pair_transfer_seconds

__all__ = [
    "COST_MODELS",
    "DEFAULT_COST_MODEL",
    "AssignmentError",
    "CostBreakdown",
    "CostModel",
    "CostModelError",
    "PairwiseTerms",
    "YuanCostModel",
    "as_assignment",
    "assignment_from_order",
    "build_cost_model",
    "pair_transfer_seconds",
    "yuan_cost_reference",
]
