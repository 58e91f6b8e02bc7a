"""Watching a run: per-rank metrics (JSON Lines), a Chrome trace, TensorBoard scalars and a report.

Light to import (no torch): the worker's side, geotrain.observe.observer, is imported by the worker.
"""

from geotrain.observe.metrics import MetricsWriter, read_metrics, step_metrics
from geotrain.observe.rundir import RunDirError, default_run_dir, sweep_old_runs
from geotrain.observe.trace import build_trace, write_trace

__all__ = ["MetricsWriter", "RunDirError", "build_trace", "default_run_dir", "read_metrics", "step_metrics",
           "sweep_old_runs", "write_trace"]
