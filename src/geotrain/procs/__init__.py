"""Processes geotrain starts: one supervisor for every launcher, dying with the launcher, the
torchrun environment, the fork-server context and naming a failure."""

from geotrain.procs.env import torchrun_env
from geotrain.procs.lifeline import (WorkerFailure, describe_exit, die_with_parent, forkserver_context, pid_alive,
                                     set_parent_death_signal, set_process_name)
from geotrain.procs.supervisor import (EXIT_PEER_LOST, Command, LaunchResult, Supervisor, Target, Verdict, exit_code_of, spawn,
                                       stop_tree)

__all__ = [
    "EXIT_PEER_LOST",
    "Command",
    "LaunchResult",
    "Supervisor",
    "Target",
    "Verdict",
    "WorkerFailure",
    "describe_exit",
    "die_with_parent",
    "exit_code_of",
    "forkserver_context",
    "pid_alive",
    "set_parent_death_signal",
    "set_process_name",
    "spawn",
    "stop_tree",
    "torchrun_env",
]
