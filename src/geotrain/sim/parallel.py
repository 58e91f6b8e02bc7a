"""Several independent training runs, in this process or spread over a pool of processes.

Why processes, not threads: on a small, shared CPU one torch thread per run in separate processes
scales cleanly, while several intra-op threads per run stall whenever another program holds a core.
Each run is deterministic given its config, so a run gives the same bits in any pool position.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from multiprocessing.managers import SyncManager
from typing import Any

import torch

from geotrain.data import WorldTokens
from geotrain.procs import die_with_parent
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
    of fresh ("spawn") processes, each running one job at a time with `threads_per_process` torch
    threads. An exception in a job is raised here.
    """
    if processes < 1 or threads_per_process < 1:
        raise TrainingConfigError(f"processes and threads_per_process must be >= 1, got {processes}, {threads_per_process}")
    if processes == 1:
        results = []
        for job in jobs:
            with _open(progress, job) as callback:
                results.append(train_compressed(job.config, data, job.update_rule, callback))
        return results
    context = multiprocessing.get_context("spawn")
    # Every process of the pool and the manager dies with this one (geotrain.procs): a caller's
    # SIGKILL leaves no orphan behind.
    lifeline = (os.getpid(),)
    manager = SyncManager(ctx=context)
    manager.start(die_with_parent, lifeline)
    with manager, ProcessPoolExecutor(min(processes, len(jobs)), mp_context=context, initializer=die_with_parent,
                                      initargs=lifeline) as pool:
        queue = manager.Queue()
        futures = [pool.submit(_run_job, i, job, data, threads_per_process, queue) for i, job in enumerate(jobs)]
        steps_done: dict[int, int] = {}  # job index -> steps reported so far
        try:
            return [_follow(future, i, job, queue, steps_done, progress)
                    for i, (future, job) in enumerate(zip(futures, jobs, strict=True))]
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _open(progress: ProgressFactory | None, job: TrainingJob) -> AbstractContextManager[Any]:
    return progress(job.label or job.config.codec, job.config.steps) if progress else nullcontext(None)


def _follow(future: Future[TrainingResult], index: int, job: TrainingJob, queue: Any,
            steps_done: dict[int, int], progress: ProgressFactory | None) -> TrainingResult:
    """Wait for job `index`, showing its progress as the pool reports it through `queue`."""
    with _open(progress, job) as callback:
        while True:
            while not queue.empty():
                i, steps = queue.get()
                steps_done[i] = steps
            if callback is not None:
                callback(steps_done.get(index, 0), job.config.steps)
            finished, _ = wait([future], timeout=_POLL_S)
            if finished:
                return future.result()


def _run_job(index: int, job: TrainingJob, data: WorldTokens, threads: int, queue: Any) -> TrainingResult:
    """Pool side: one job with `threads` torch threads, reporting (index, steps done) every few steps."""
    torch.set_num_threads(threads)

    def report(done: float, total: float) -> None:
        if done % _REPORT_EVERY_STEPS == 0 or done == total:
            queue.put((index, int(done)))

    return train_compressed(job.config, data, job.update_rule, report)
