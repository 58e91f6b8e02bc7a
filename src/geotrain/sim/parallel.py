"""Several independent training runs, in this process or spread over a pool of processes.

Why processes, not threads: on a small, shared CPU one torch thread per run in separate processes
scales cleanly, while several intra-op threads per run stall whenever another program holds a core.
Each run is deterministic given its config, so a run gives the same bits in any pool position.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from geotrain.data import WorldTokens
from geotrain.procs import Supervisor, Target, WorkerFailure, describe_exit
from geotrain.sim.config import TrainConfig, TrainingConfigError, TrainingResult
from geotrain.sim.loop import UpdateRuleFactory, codec_update_rule, train_compressed

ProgressFactory = Callable[[str, float], AbstractContextManager[Any]]
"""progress(description, total) -> a context manager yielding a callback(done, total) (or None)."""

_POLL_S = 0.2
_REPORT_EVERY_STEPS = 5


@dataclass(frozen=True)
class TrainingJob:
    """One run: its config, its update rule factory (a module-level function, so that it pickles) and a label."""

    config: TrainConfig
    update_rule: UpdateRuleFactory = codec_update_rule
    label: str = ""


def train_many(jobs: Sequence[TrainingJob], data: WorldTokens, processes: int = 1, threads_per_process: int = 1,
               progress: ProgressFactory | None = None) -> list[TrainingResult]:
    """Train every job; results in job order. One progress bar per job, opened in job order.

    processes == 1: in this process, with its current torch thread count. processes > 1: a pool
    of fresh ("spawn") processes, each running its share of the jobs one at a time with
    `threads_per_process` torch threads. An exception in a job is raised here (after every pool
    process is stopped); a pool process that dies is a WorkerFailure.
    """
    if processes < 1 or threads_per_process < 1:
        raise TrainingConfigError(f"processes and threads_per_process must be >= 1, got {processes}, {threads_per_process}")
    if processes == 1:
        results = []
        for job in jobs:
            with _open(progress, job) as callback:
                results.append(train_compressed(job.config, data, job.update_rule, callback))
        return results
    # Worker w runs jobs w, w + n, w + 2n, ... (each job's bits do not depend on where it runs);
    # each worker is a rank of the one supervisor, so it dies with this process and a Ctrl-C here
    # stops every worker at once instead of waiting for the jobs to finish.
    context = multiprocessing.get_context("spawn")
    workers = min(processes, len(jobs))
    queue = context.Queue()
    specs = [Target(context, _run_jobs, (tuple(range(w, len(jobs), workers)), tuple(jobs), data, threads_per_process,
                                         queue), f"geotrain-pool-{w}") for w in range(workers)]
    state = _PoolState()
    try:
        with Supervisor(specs, grace_s=0.0, term_s=1.0, poll_s=_POLL_S) as supervisor:
            return [_follow(supervisor, i, job, queue, state, progress) for i, job in enumerate(jobs)]
    finally:
        queue.close()


@dataclass
class _PoolState:
    """What the pool has reported so far: steps done and results, by job index."""

    steps: dict[int, int] = field(default_factory=dict)
    results: dict[int, TrainingResult] = field(default_factory=dict)


def _open(progress: ProgressFactory | None, job: TrainingJob) -> AbstractContextManager[Any]:
    return progress(job.label or job.config.codec, job.config.steps) if progress else nullcontext(None)


def _follow(supervisor: Supervisor, index: int, job: TrainingJob, queue: Any, state: _PoolState,
            progress: ProgressFactory | None) -> TrainingResult:
    """Wait for job `index`, showing its progress as the pool reports it through `queue`; a job's
    exception is raised here, a worker that dies is a WorkerFailure."""
    with _open(progress, job) as callback:
        while index not in state.results:
            try:
                i, kind, value = queue.get(timeout=_POLL_S)
            except queue_module.Empty:
                codes = supervisor.poll()
                dead = [(w, code) for w, code in enumerate(codes) if code not in (None, 0)]
                if dead or (all(code == 0 for code in codes) and queue.empty()):  # died, or all ended without it
                    w, code = dead[0] if dead else (0, 0)
                    raise WorkerFailure(f"training pool worker {w} {describe_exit(code)} before job {index} "
                                        f"({job.label or job.config.codec}) finished")
                continue
            if kind == "error":
                raise value
            if kind == "steps":
                state.steps[i] = value
            else:
                state.results[i] = value
            if callback is not None:
                callback(state.steps.get(index, 0), job.config.steps)
        return state.results[index]


def _run_jobs(indices: tuple[int, ...], jobs: tuple[TrainingJob, ...], data: WorldTokens, threads: int,
              queue: Any) -> None:
    """Pool side: jobs `indices` one after the other with `threads` torch threads, reporting
    (index, "steps", done) every few steps and then (index, "result", result) or (index, "error", exc)."""
    torch.set_num_threads(threads)
    for index in indices:
        job = jobs[index]

        def report(done: float, total: float, index: int = index) -> None:
            if done % _REPORT_EVERY_STEPS == 0 or done == total:
                queue.put((index, "steps", int(done)))

        try:
            queue.put((index, "result", train_compressed(job.config, data, job.update_rule, report)))
        except Exception as exc:  # noqa: BLE001 - raised again in the launcher
            queue.put((index, "error", exc))
            break
    queue.close()
    queue.join_thread()
