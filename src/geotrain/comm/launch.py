"""`run_workers`: run a function on N gloo ranks in this machine's processes and collect its results.

The processes are started and stopped by the one supervisor (geotrain.procs.Supervisor) from a fork
server that has imported torch (starts are cheap); each dies with the launcher. Failures raise one
`WorkerFailure` (geotrain.procs).

    results = run_workers(train_fn, world_size=4, args=(config,), timeout_s=120)

Each worker calls `fn(rank, world_size, *args)` after `init_process_group` (file store in a private
temporary directory, so no TCP port can collide) and sends back its return value. The launcher
fails loudly instead of hanging: if a worker raises, dies (a signal, `os._exit`) or the time limit
passes, every other worker is killed at once and `WorkerFailure` names the rank and carries its
traceback. Collectives also get a timeout, and every worker dies with the launcher
(geotrain.procs: a parent-death signal and a watch on the launcher's pid), so none is orphaned
when the launcher itself is killed.

`fn` and its arguments must be picklable (defined at module top level). Return values travel by
value (plain pickle, never shared memory), so they may hold small CPU tensors.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import queue as queue_module
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from geotrain.procs import Supervisor, Target, WorkerFailure, describe_exit, forkserver_context


_POLL_S = 0.1

FORKSERVER_PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "torch.optim",
                      "geotrain.comm", "geotrain.ddp", "geotrain.runtime.worker")
"""What any geotrain worker imports, imported once by the fork server. The preload list only counts for
the first server of a process, so both launchers give the same one: whichever starts it first, the
other's workers do not pay seconds of imports each (DDP's constructor alone imports torch._dynamo)."""


def _worker_entry(fn: Callable[..., Any], rank: int, world_size: int, store_path: str, backend: str,
                  collective_timeout_s: float, args: Sequence[Any], results: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # the workers share the machine's cores; one thread each is deterministic too
    try:
        timeout = datetime.timedelta(seconds=collective_timeout_s)
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timeout)
        _wait_for_every_rank(f"{store_path}.ready", world_size, timeout)
        value = fn(rank, world_size, *args)
        results.put((rank, "ok", pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 - report everything, including SystemExit, to the launcher
        results.put((rank, "error", traceback.format_exc()))
        results.close()
        results.join_thread()
        os._exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    results.close()
    results.join_thread()


def _wait_for_every_rank(path: str, world_size: int, timeout: datetime.timedelta) -> None:
    """Return once every rank has come out of init_process_group. gloo's full mesh is connected when a rank's
    own init returns, not yet its peers': a rank whose function returns at once would otherwise destroy its group
    while a peer still connects ("Connection closed by peer"). Through a store of its own, not a collective, so
    that no emulated link's clock counts it."""
    import torch.distributed as dist

    store = dist.FileStore(path, world_size)
    store.set_timeout(timeout)
    if store.add("arrived", 1) == world_size:
        store.set("everyone", "1")
    store.wait(["everyone"])


def run_workers(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *, timeout_s: float = 120.0,
                backend: str = "gloo", start_method: str | None = None,
                collective_timeout_s: float | None = None) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` processes; return their results by rank.

    timeout_s: wall-clock limit for the whole run, start-up included (seconds).
    collective_timeout_s: the process group's timeout for one collective (default: timeout_s).
    Raises WorkerFailure (after killing every worker) on an exception, a dead worker or a timeout.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if start_method is None:
        context = forkserver_context([*FORKSERVER_PRELOAD, fn.__module__])
    else:
        context = multiprocessing.get_context(start_method)
    store_dir = tempfile.mkdtemp(prefix="geotrain-pg-")
    results_queue = context.Queue()
    deadline = time.monotonic() + timeout_s
    specs = [Target(context, _worker_entry, (fn, rank, world_size, os.path.join(store_dir, "store"), backend,
                                             float(collective_timeout_s or timeout_s), tuple(args), results_queue),
                    f"geotrain-worker-{rank}", daemon=True) for rank in range(world_size)]
    try:
        # term_s=0: on a failure every other worker is SIGKILLed at once (they hold no state worth saving).
        with Supervisor(specs, term_s=0.0, cleanup_paths=[Path(store_dir)]) as supervisor:
            return _collect(supervisor, results_queue, deadline, timeout_s)
    finally:
        results_queue.close()
        shutil.rmtree(store_dir, ignore_errors=True)


def _collect(supervisor: Supervisor, results_queue: Any, deadline: float, timeout_s: float) -> list[Any]:
    world_size = supervisor.world_size
    results: dict[int, Any] = {}
    while len(results) < world_size:
        message = _next_message(results_queue, deadline)
        messages = [message] if message is not None else []
        codes = supervisor.poll()
        dead = [rank for rank, code in enumerate(codes) if rank not in results and code is not None]
        if dead or any(status == "error" for _, status, _ in messages):
            # Let the other workers' reports arrive: a worker that dies makes its peers raise too,
            # and the message should name the root cause (the dead one) first.
            time.sleep(0.5)
            messages += _drain(results_queue)
        codes = supervisor.poll()
        exited = {rank for rank in range(world_size) if codes[rank] is not None and rank not in results}
        # a worker that exited after the drain above may have put its report first: it is still in the queue's
        # pipe (a loaded CI host saw two ranks that exited with status 0 counted as silent)
        messages += _await_reports(results_queue, exited - {rank for rank, _, _ in messages}, EXITED_REPORT_GRACE_S)
        errors = []
        for rank, status, value in messages:
            if status == "error":
                errors.append((rank, value))
            else:
                results[rank] = pickle.loads(value)
        reported = set(results) | {rank for rank, _ in errors}
        silent = [(rank, codes[rank]) for rank in range(world_size) if rank not in reported and codes[rank] is not None]
        if silent or errors:
            parts = [f"worker rank {rank} died without reporting ({describe_exit(code)})" for rank, code in silent]
            parts += [f"worker rank {rank} raised" for rank, _ in errors]
            # A rank that died silently is the cause; the others' errors (a lost peer) are its
            # consequence: their tracebacks would only bury the one line that matters.
            detail = f"\n--- traceback of rank {errors[0][0]} ---\n{errors[0][1]}" if errors and not silent else ""
            raise WorkerFailure(f"{'; '.join(parts)} (world size {world_size}); all workers stopped{detail}")
        if time.monotonic() >= deadline and len(results) < world_size:
            missing = sorted(set(range(world_size)) - set(results))
            raise WorkerFailure(f"workers {missing} of {world_size} did not finish within {timeout_s:.0f} s "
                                f"(hung or too slow); all workers killed")
    return [results[rank] for rank in range(world_size)]


def _next_message(results_queue: Any, deadline: float) -> tuple[int, str, Any] | None:
    wait_s = max(0.0, min(_POLL_S, deadline - time.monotonic()))
    try:
        return results_queue.get(timeout=wait_s)
    except queue_module.Empty:
        return None


EXITED_REPORT_GRACE_S = 2.0
"""How long the launcher still reads the results queue for a worker it saw exit without a report (seconds)."""


def _await_reports(results_queue: Any, ranks: set[int], grace_s: float) -> list[tuple[int, str, Any]]:
    """The messages that arrive until each of `ranks` has reported or `grace_s` seconds have passed."""
    messages: list[tuple[int, str, Any]] = []
    end = time.monotonic() + grace_s
    while ranks - {rank for rank, _, _ in messages} and time.monotonic() < end:
        messages += _drain(results_queue)
    return messages


def _drain(results_queue: Any) -> list[tuple[int, str, Any]]:
    messages = []
    while True:
        try:
            messages.append(results_queue.get(timeout=_POLL_S))
        except queue_module.Empty:
            return messages
