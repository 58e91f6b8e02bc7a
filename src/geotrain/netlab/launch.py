"""Run a torch.distributed program in a lab: one process per lab device, as torchrun would start it.

Each rank runs in its own namespace, so it is a host of its own: RANK, WORLD_SIZE, GROUP_RANK =
NODE_RANK = the rank, LOCAL_RANK = 0, LOCAL_WORLD_SIZE = 1, MASTER_ADDR = rank 0's lab address,
MASTER_PORT (free by construction: the namespaces are new), GLOO_SOCKET_IFNAME = the device's lab
interface (so gloo's TCP goes through the shaped links), plus GEOTRAIN_NETLAB (the lab prefix) and
GEOTRAIN_DEVICE (the cluster device index this rank plays).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from geotrain.netlab.lab import NetLab
from geotrain.netlab.processes import enter_namespace
from geotrain.procs import Command, Supervisor
from geotrain.procs import torchrun_env as rank_env

DEFAULT_MASTER_PORT = 29500
FAILURE_GRACE_S = 10.0


@dataclass(frozen=True)
class WorkerResult:
    """How one rank ended: exit code (negative: killed by that signal; None: timed out) and output."""

    rank: int
    returncode: int | None
    output: str


def torchrun_env(lab: NetLab, rank: int, master_port: int = DEFAULT_MASTER_PORT,
                 base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of rank `rank` (on top of `base`, default os.environ)."""
    device = lab.devices[rank]
    return rank_env(rank, len(lab.devices), lab.devices[0].address, master_port, local_rank=0, local_world_size=1,
                    group_rank=rank, base=base, single_thread=False, NODE_RANK=str(rank),
                    GLOO_SOCKET_IFNAME=device.ifname, GEOTRAIN_NETLAB=lab.prefix, GEOTRAIN_DEVICE=str(device.device))


def run_script(lab: NetLab, argv: Sequence[str], *, timeout_s: float | None = None, capture: bool = False,
               env: Mapping[str, str] | None = None, grace_s: float = FAILURE_GRACE_S,
               poll_s: float = 0.05) -> list[WorkerResult]:
    """Run `argv` (e.g. [python, script.py, args...]) once per rank and wait for all.

    When a rank fails the others get `grace_s` to notice and exit, then are stopped; after
    `timeout_s` every rank still running is stopped and reported with returncode None.
    `capture`: collect each rank's stdout+stderr in WorkerResult.output (else they are inherited)."""
    with tempfile.TemporaryDirectory(prefix="geotrain-netlab-") as tmp:
        logs = [Path(tmp) / f"rank{rank}.log" for rank in range(len(lab.devices))]
        specs = [Command(tuple(argv), torchrun_env(lab, rank, base=env), log if capture else None,
                         enter_namespace(lab.devices[rank].namespace)) for rank, log in enumerate(logs)]
        with Supervisor(specs, grace_s=grace_s, term_s=2.0, timeout_s=timeout_s, poll_s=poll_s,
                        cleanup_paths=[Path(tmp)]) as supervisor:
            verdict = supervisor.wait()
        codes = [None if verdict.timed_out and rank in verdict.stopped else code
                 for rank, code in enumerate(verdict.returncodes)]
        return [WorkerResult(rank, code, log.read_text(errors="replace") if capture else "")
                for rank, (code, log) in enumerate(zip(codes, logs))]


def worst_exit_code(results: Sequence[WorkerResult]) -> int:
    """The exit code a launcher should return: 0 if all succeeded, else the first failure's code
    (124 for a timeout, 128+N for a signal N)."""
    for result in results:
        if result.returncode is None:
            return 124
        if result.returncode < 0:
            return 128 - result.returncode
        if result.returncode != 0:
            return result.returncode
    return 0
