"""A lower bound proven beside the search, on another core (`geotrain plan --lower-bound --time-limit T`).

In sequence, the search and the bound split T (`cli.plan_cmd.time_budget`: the bound gets 40 %). But
the bound's MILPs run in the watchdog's child process (`bounds.lower_bound(guard=True)`), so the
parent only waits for them. `BoundBeside` starts that wait in a thread when the search reports its
first plan (`run_search(on_plan=...)`), and the child has until the search's own deadline. The plan's
total is the upper bound U that prunes the bound's region paths and staircase pieces. Later plans of
the search only tighten the gap: every part of the bound is min(U, ...) <= OPT for any plan's U.

Where it pays: once the heuristics have found the plan, the bound gets T minus their seconds instead
of 0.4 T, and the staircase bounds grow with their time (docs/history/placement.md, "The bound beside the
search"). With one core the two would share it, so the command uses this only when it may run on two
or more (`usable_cores`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace

from geotrain.search.base import PlacementProblem, SearchResult
from geotrain.search.bounds import MIN_REGION_TIME_S, LowerBound, lower_bound, with_bound, with_lower_bound


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class BoundBeside:
    """The lower bound of `problem`, computed in a thread from the first plan `offer` gets until
    `deadline` (time.perf_counter()); `finish` adds it to the search's final result."""

    def __init__(self, problem: PlacementProblem, deadline: float) -> None:
        self.problem = problem
        self.deadline = deadline
        self.upper_bound_s: float | None = None
        self.started_at: float | None = None
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._bound: LowerBound | None = None
        self._error: BaseException | None = None

    def offer(self, result: SearchResult) -> None:
        """The search's `on_plan`: the first plan starts the bound (when at least MIN_REGION_TIME_S are
        left before the deadline); later plans change nothing."""
        left = self.deadline - time.perf_counter()
        if self._thread is not None or left < MIN_REGION_TIME_S:
            return
        self.upper_bound_s, self.started_at = float(result.cost.total), time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(left,), name="geotrain-bound", daemon=True)
        self._thread.start()

    def _run(self, time_limit_s: float) -> None:
        try:
            self._bound = lower_bound(self.problem, upper_bound_s=self.upper_bound_s, time_limit_s=time_limit_s,
                                      guard=True, cancel=self._cancel)
        except BaseException as exc:  # noqa: BLE001 - re-raised by finish() in the caller's thread
            self._error = exc

    def finish(self, result: SearchResult) -> SearchResult:
        """`result` (the search's final plan) with the bound. A plan the search proved optimal ends the
        bound at once; if no plan started it, the bound runs now with the time left (as in sequence)."""
        if self._thread is None:
            left = max(0.0, self.deadline - time.perf_counter())
            return _beside(with_lower_bound(self.problem, result, time_limit_s=left), False)
        if result.proven_optimal:
            self._cancel.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._bound is not None
        return _beside(with_bound(result, self._bound), True, self.upper_bound_s)


def _beside(result: SearchResult, beside: bool, upper_bound_s: float | None = None) -> SearchResult:
    """Records in details whether the bound ran beside the search, and the plan total it started from."""
    details = {**result.details, "lower_bound_beside": beside}
    if upper_bound_s is not None:
        details["lower_bound_upper_s"] = upper_bound_s
    return replace(result, details=details)
