"""Synchronise every step: the gradients averaged by an exchange (a codec reducer, PowerSGD, the
hierarchical all-reduce), clipped globally, then the optimizer steps.

Global clipping (`clip`): the norm of the whole model's averaged gradient, all stages. `sum_squares`
turns this rank's sum of squares into the global one (geotrain.runtime.dp_step: a float64 scalar
all-reduce over the world, not timed as DP communication: one latency per step); every rank then
scales its gradient by the same factor (geotrain.comm.clip_grad_norm_).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.comm.clip import clip_grad_norm_
from geotrain.sync.base import DPExchange, GradientSync, StepTimer, SyncResult


class PerStepSync(GradientSync):
    """Every step: `exchange` averages the gradients, optional global clip, `optimizer.step()`."""

    def __init__(self, params: Sequence[torch.nn.Parameter], exchange: DPExchange,
                 optimizer: torch.optim.Optimizer, clip: float | None = None,
                 sum_squares: Callable[[float], float] | None = None) -> None:
        self.params = list(params)
        self.exchange = exchange
        self.optimizer = optimizer
        self.clip = clip
        self.sum_squares = sum_squares

    def step(self, step: int, timer: StepTimer) -> SyncResult:
        dp_bytes = self.exchange.exchange(step, timer)
        return SyncResult(dp_bytes, self.apply_mean(timer))

    def apply_mean(self, timer: StepTimer) -> float | None:
        """The gradients hold the group's mean: optional global clip, then `optimizer.step()`; returns
        the norm before clipping (None without clipping)."""
        norm = None
        if self.clip is not None:
            with timer:
                norm = clip_grad_norm_([p.grad for p in self.params if p.grad is not None], self.clip,
                                       self.sum_squares)
        with timer:
            self.optimizer.step()
        return norm

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "exchange": self.exchange.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.exchange.load_state_dict(state["exchange"])
