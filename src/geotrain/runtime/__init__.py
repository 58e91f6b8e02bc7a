"""Run a plan: pipeline x data-parallel training of any layer-list model (tiny GPT, hf:..., file.py:fn) on
torch.distributed.pipelining schedules (gloo, or NCCL on CUDA), with every transfer slowed to the cluster's
emulated link speeds (geotrain.emulate), failure detection and sharded checkpoints."""

from geotrain.lazy import lazy_exports

# Imported on first use: `geotrain.runtime.config` alone (what the CLI's flags need) must not pull in
# the launcher, the worker and torch.distributed.pipelining.
_HOMES = {
    "CheckpointError": "geotrain.runtime.checkpoint",
    "CommPrediction": "geotrain.runtime.predict",
    "EXIT_PEER_LOST": "geotrain.runtime.watchdog",
    "IterationRow": "geotrain.runtime.report",
    "LaunchResult": "geotrain.runtime.launcher",
    "Layout": "geotrain.runtime.layout",
    "LayoutError": "geotrain.runtime.layout",
    "PIPELINE_SCHEDULES": "geotrain.runtime.pipeline_schedules",
    "PP_CODECS": "geotrain.runtime.sections",
    "RunReport": "geotrain.runtime.report",
    "RuntimeConfig": "geotrain.runtime.config",
    "RuntimeConfigError": "geotrain.runtime.config",
    "SPLIT_RULES": "geotrain.runtime.stages",
    "Slot": "geotrain.runtime.layout",
    "StageModule": "geotrain.runtime.stages",
    "WorkerFailure": "geotrain.runtime.launcher",
    "build_layer_model": "geotrain.runtime.stages",
    "build_report": "geotrain.runtime.report",
    "build_stage": "geotrain.runtime.stages",
    "busy_seconds": "geotrain.runtime.links",
    "latest_step": "geotrain.runtime.checkpoint",
    "launch": "geotrain.runtime.launcher",
    "measured_traffic": "geotrain.runtime.predict",
    "parse_codec_spec": "geotrain.codecs",
    "predict_comm": "geotrain.runtime.predict",
    "relative_error_pct": "geotrain.runtime.report",
    "run_worker": "geotrain.runtime.worker",
    "stage_boundaries": "geotrain.runtime.stages",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())

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
