"""Communication cost models: score an (S, R) assignment of devices in seconds per iteration."""

from geotrain.cost.actions import Action, ScheduleError, schedule_actions
from geotrain.cost.assignment import AssignmentError, as_assignment, assignment_from_order
from geotrain.cost.base import CostBreakdown, CostModel, PairwiseTerms
from geotrain.cost.compute import YuanComputeCostModel
from geotrain.cost.dtfm import DtfmCostModel
from geotrain.cost.gpus import GPU_MEMORY_GIB, GPU_PEAK_TFLOPS, UnknownGpuError, gpu_memory_bytes, gpu_peak_flops
from geotrain.cost.layer_split import (LayerSplitError, StageShares, counts_to_boundaries, device_peak_flops,
                                       speed_layer_counts, stage_speeds)
from geotrain.cost.matching import bottleneck_assignment, bottleneck_ring
from geotrain.cost.reference import yuan_cost_reference
from geotrain.cost.memory import MemoryConfig, stage_memory_bytes
from geotrain.cost.ring import RingCostModel
from geotrain.cost.schedule import ScheduleCostModel, pipeline_order, simulate_pipeline
from geotrain.cost.registry import (COST_MODELS, DEFAULT_COST_MODEL, TRAFFIC_MODELS, UNEVEN_SPLIT_MODELS,
                                    CostModelError, build_cost_model, build_traffic_model)
from geotrain.cost.traffic import Traffic, TrafficError, WireBytes, traffic_of_job
from geotrain.cost.yuan import YuanCostModel, pair_transfer_seconds

__all__ = [
    "COST_MODELS",
    "DEFAULT_COST_MODEL",
    "GPU_MEMORY_GIB",
    "GPU_PEAK_TFLOPS",
    "TRAFFIC_MODELS",
    "UNEVEN_SPLIT_MODELS",
    "Action",
    "AssignmentError",
    "CostBreakdown",
    "CostModel",
    "CostModelError",
    "DtfmCostModel",
    "LayerSplitError",
    "MemoryConfig",
    "PairwiseTerms",
    "RingCostModel",
    "ScheduleCostModel",
    "ScheduleError",
    "StageShares",
    "Traffic",
    "TrafficError",
    "UnknownGpuError",
    "WireBytes",
    "YuanComputeCostModel",
    "YuanCostModel",
    "as_assignment",
    "assignment_from_order",
    "bottleneck_assignment",
    "bottleneck_ring",
    "build_cost_model",
    "build_traffic_model",
    "counts_to_boundaries",
    "device_peak_flops",
    "gpu_memory_bytes",
    "gpu_peak_flops",
    "pair_transfer_seconds",
    "pipeline_order",
    "schedule_actions",
    "simulate_pipeline",
    "speed_layer_counts",
    "stage_memory_bytes",
    "stage_speeds",
    "traffic_of_job",
    "yuan_cost_reference",
]
