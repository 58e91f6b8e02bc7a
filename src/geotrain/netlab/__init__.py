"""Real shaped links on one Linux machine: one network namespace per device, htb per device pair."""

from geotrain.netlab.lab import LabSignal, NetLab, sweep_stale_labs
from geotrain.netlab.launch import WorkerResult, run_script, torchrun_env, worst_exit_code
from geotrain.netlab.topology import LabDevice, LabTopology, NetLabError, lab_topology

__all__ = [
    "LabDevice",
    "LabSignal",
    "LabTopology",
    "NetLab",
    "NetLabError",
    "WorkerResult",
    "lab_topology",
    "run_script",
    "sweep_stale_labs",
    "torchrun_env",
    "worst_exit_code",
]
