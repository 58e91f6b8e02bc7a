"""Every step's gradient exchange overlapped with the next `delay` (tau) steps: delayed gradients.

Step t (0-based), after backward: this replica's gradient g_t is encoded and its exchange posted (async
work of the DP group, `StageExchange.start`: codec, error feedback and residuals as the blocking exchange
has them), then the exchange started at step t - tau lands (waits, decodes: the group's mean of
g_{t-tau} in the gradients) and PerStepSync's update runs on it (global clip on the landed mean, then
the optimizer step, at step t's learning rate). So each exchange travels while the next tau steps
compute, and every replica applies the same means in the same order: the replicas stay bit-identical
at every step (no drift, unlike local SGD); the price is a gradient tau steps stale.

Steps 0..tau-1 make no update (nothing has landed yet). The alternative, blocking those steps, leaves
the same gap of tau updates at the switch to overlap (the first overlapped step has nothing to land) and
pays the blocking exchanges' time; with the learning-rate warm-up the first steps' updates are the
smallest anyway. At the last step (`total_steps`) this step's exchange and every one in flight land,
in start order, each applied with its own update: every gradient computed is applied exactly once, the
run makes as many optimizer steps as PerStepSync, and it ends with nothing in flight.

tau = 0 is PerStepSync, bit for bit (tested). Checkpoints: `state_dict` refuses while an exchange is
in flight (every step but the last), so a delayed run checkpoints at its end only; in-flight means are
never dropped silently. Every collective is posted from the training thread, so all ranks issue them
in one order; under `geotrain emulate` a posted exchange's link time overlaps compute until it is
waited for.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from geotrain.sync.base import DPExchange, StepTimer, SyncError, SyncResult
from geotrain.sync.per_step import PerStepSync


class OverlappingExchange(DPExchange, Protocol):
    """A DPExchange that can also run in two halves (geotrain.sync.exchange.StageExchange)."""

    def start(self, step: int, timer: StepTimer) -> Callable[[StepTimer], int]:
        """Encode and post now; the returned function waits, writes the means into the gradients and
        returns the bytes handed."""
        ...


class DelayedPerStepSync(PerStepSync):
    """PerStepSync whose step t applies the mean of step t - `delay`'s gradients (module doc)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], exchange: OverlappingExchange,
                 optimizer: torch.optim.Optimizer, delay: int, total_steps: int | None,
                 clip: float | None = None, sum_squares: Callable[[float], float] | None = None) -> None:
        """`total_steps`: the run's steps (the last one lands everything; None: only `flush` does)."""
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise SyncError(f"delay (steps between a gradient and its update) must be an integer >= 0, got {delay!r}")
        super().__init__(params, exchange, optimizer, clip, sum_squares)
        self.delay = delay
        self.total_steps = total_steps
        self._in_flight: deque[tuple[int, Callable[[StepTimer], int]]] = deque()

    def step(self, step: int, timer: StepTimer) -> SyncResult:
        if self.delay == 0:
            return super().step(step, timer)
        self._in_flight.append((step, self.exchange.start(step, timer)))  # type: ignore[attr-defined]
        last = self.total_steps is not None and step + 1 >= self.total_steps
        return self._land(step if not last else None, timer)

    def flush(self, step: int, timer: StepTimer) -> SyncResult:
        """Land and apply every exchange in flight (the last step does this itself)."""
        return self._land(None, timer)

    def _land(self, step: int | None, timer: StepTimer) -> SyncResult:
        """Land the exchanges started at or before `step` - delay (None: all), each with its update;
        bytes handed by the landed ones, and the last landed mean's norm (None: none landed / no clip)."""
        dp_bytes, norm = 0, None
        while self._in_flight and (step is None or self._in_flight[0][0] + self.delay <= step):
            _, land = self._in_flight.popleft()
            dp_bytes += land(timer)
            norm = self.apply_mean(timer)
        return SyncResult(dp_bytes, norm)

    @property
    def in_flight(self) -> int:
        """Exchanges started and not yet landed."""
        return len(self._in_flight)

    def state_dict(self) -> dict[str, Any]:
        """PerStepSync's state; refused while an exchange is in flight (its mean would be lost)."""
        if self._in_flight:
            raise SyncError(f"state_dict with {len(self._in_flight)} gradient exchange(s) in flight (delay "
                            f"{self.delay}): a delayed run checkpoints at its last step only")
        return super().state_dict()
