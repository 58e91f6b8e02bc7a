"""Run a plan: pipeline x data-parallel training of any layer-list model (tiny GPT, hf:..., file.py:fn) on
torch.distributed.pipelining schedules (gloo, or NCCL on CUDA), with every transfer slowed to the cluster's
emulated link speeds (geotrain.emulate), failure detection and sharded checkpoints."""

from geotrain.runtime.checkpoint import CheckpointError, latest_step
from geotrain.codecs import parse_codec_spec
from geotrain.runtime.config import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.launcher import LaunchResult, WorkerFailure, launch
from geotrain.runtime.layout import Layout, LayoutError, Slot
from geotrain.runtime.links import busy_seconds
from geotrain.runtime.pipeline import PIPELINE_SCHEDULES
from geotrain.runtime.predict import CommPrediction, measured_traffic, predict_comm
from geotrain.runtime.sections import PP_CODECS
from geotrain.runtime.report import IterationRow, RunReport, build_report, relative_error_pct
from geotrain.runtime.stages import SPLIT_RULES, StageModule, build_layer_model, build_stage, stage_boundaries
from geotrain.runtime.watchdog import EXIT_PEER_LOST
from geotrain.runtime.worker import run_worker

__all__ = [
    "EXIT_PEER_LOST",
    "PIPELINE_SCHEDULES",
    "PP_CODECS",
    "CheckpointError",
    "CommPrediction",
    "SPLIT_RULES",
    "StageModule",
    "IterationRow",
    "LaunchResult",
    "Layout",
    "LayoutError",
    "RunReport",
    "RuntimeConfig",
    "RuntimeConfigError",
    "Slot",
    "WorkerFailure",
    "build_report",
    "build_layer_model",
    "build_stage",
    "busy_seconds",
    "latest_step",
    "launch",
    "parse_codec_spec",
    "predict_comm",
    "measured_traffic",
    "relative_error_pct",
    "run_worker",
    "stage_boundaries",
]
