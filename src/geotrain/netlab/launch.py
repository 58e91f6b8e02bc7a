"""Run a torch.distributed program in a lab: one process per lab device, as torchrun would start it.

Each rank runs in its own namespace, so it is a host of its own: RANK, WORLD_SIZE, GROUP_RANK =
NODE_RANK = the rank, LOCAL_RANK = 0, LOCAL_WORLD_SIZE = 1, MASTER_ADDR = rank 0's lab address,
MASTER_PORT (free by construction: the namespaces are new), GLOO_SOCKET_IFNAME = the device's lab
interface (so gloo's TCP goes through the shaped links), plus GEOTRAIN_NETLAB (the lab prefix) and
GEOTRAIN_DEVICE (the cluster device index this rank plays).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from geotrain.netlab.lab import NetLab
from geotrain.netlab.processes import stop_process

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
    world = str(len(lab.devices))
    env = dict(os.environ if base is None else base)
    env.update(RANK=str(rank), WORLD_SIZE=world, GROUP_RANK=str(rank), NODE_RANK=str(rank), LOCAL_RANK="0",
               LOCAL_WORLD_SIZE="1", MASTER_ADDR=lab.devices[0].address, MASTER_PORT=str(master_port),
               GLOO_SOCKET_IFNAME=device.ifname, GEOTRAIN_NETLAB=lab.prefix, GEOTRAIN_DEVICE=str(device.device))
    return env


def run_script(lab: NetLab, argv: Sequence[str], *, timeout_s: float | None = None, capture: bool = False,
               env: Mapping[str, str] | None = None, grace_s: float = FAILURE_GRACE_S,
               poll_s: float = 0.05) -> list[WorkerResult]:
    """Run `argv` (e.g. [python, script.py, args...]) once per rank and wait for all.

    When a rank fails the others get `grace_s` to notice and exit, then are stopped; after
    `timeout_s` every rank still running is stopped and reported with returncode None.
    `capture`: collect each rank's stdout+stderr in WorkerResult.output (else they are inherited)."""
    with tempfile.TemporaryDirectory(prefix="geotrain-netlab-") as tmp:
        logs = [Path(tmp) / f"rank{rank}.log" for rank in range(len(lab.devices))]
        processes = []
        for rank, log in enumerate(logs):
            stream = open(log, "wb") if capture else None  # noqa: SIM115 - closed below
            try:
                processes.append(lab.run(rank, argv, torchrun_env(lab, rank, base=env), stdout=stream,
                                         stderr=None if stream is None else stream))
            finally:
                if stream is not None:
                    stream.close()
        timed_out = _wait(processes, timeout_s, grace_s, poll_s)
        codes = []
        for process in processes:
            running = process.poll() is None
            code = stop_process(process)
            codes.append(None if running and timed_out else code)
        return [WorkerResult(rank, code, log.read_text(errors="replace") if capture else "")
                for rank, (code, log) in enumerate(zip(codes, logs))]


def _wait(processes: list, timeout_s: float | None, grace_s: float, poll_s: float) -> bool:
    """Wait until all exit, or one fails and the grace period ends; True if `timeout_s` ran out."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    failed_at = None
    while True:
        codes = [p.poll() for p in processes]
        if all(code is not None for code in codes):
            return False
        now = time.monotonic()
        if failed_at is None and any(code not in (None, 0) for code in codes):
            failed_at = now
        if failed_at is not None and now - failed_at > grace_s:
            return False
        if deadline is not None and now > deadline:
            return True
        time.sleep(poll_s)


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
