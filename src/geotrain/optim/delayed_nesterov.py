"""The outer optimizer of asynchronous DiLoCo: delayed Nesterov momentum with staleness weighting.

Asynchronous Local-SGD (Liu, Chhaparia, Douillard et al. 2024) applies each replica's outer gradient to
the global model as soon as it arrives. Plain Nesterov momentum then multiplies stale gradients; their
delayed Nesterov (DN) touches the momentum only once every N arrivals and in between applies the plain
gradient. Our form, for arrival t = 1, 2, ... with outer gradient g_t (anchor the replica started from -
its parameters), staleness s_t (global updates applied since that replica took its anchor) and weight
w_t = (1 + s_t) ** -staleness_power:

    buffer += w_t g_t
    if t % N == 0:   momentum = beta momentum + buffer / N;  buffer = 0
                     theta   -= lr (beta momentum + w_t g_t / N)
    else:            theta   -= lr w_t g_t / N

So N fresh arrivals from one anchor move theta by exactly one synchronous Nesterov step on their mean
(torch.optim.SGD, nesterov=True; N = 1 is that step itself): the asynchronous run spreads a DiLoCo
outer step over the arrivals that make it (tests/unit/optim/test_delayed_nesterov.py holds it to a
hand computation). N defaults to the number of replicas (the paper's choice). Staleness weighting
(power 0, the default: off; 0.5: 1/sqrt(1 + s)) damps the gradient of a slow replica that started many updates
ago; measured on bench hetero it cost more than it saved (geotrain.cost.async_outer.STALENESS_POWER).

All tensors are flat float32 (the global model as one buffer); the state is explicit and saved whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from geotrain.cost.async_outer import STALENESS_POWER
from geotrain.optim.outer import DILOCO_LR, DILOCO_MOMENTUM, OuterStepError

# STALENESS_POWER: the default staleness weight's power, 0 (every update at full weight; 0.5 counted a gradient 3
# updates stale half); its home is the cost model that prices it (geotrain.cost.async_outer)


def staleness_weight(staleness: int, power: float) -> float:
    """(1 + staleness) ** -power; staleness >= 0 (global updates since the replica's anchor)."""
    if staleness < 0:
        raise OuterStepError(f"staleness must be >= 0, got {staleness!r}")
    return float((1.0 + staleness) ** -power)


@dataclass
class DelayedNesterov:
    """Delayed Nesterov on a flat float32 model (module doc). `period` N >= 1 arrivals per momentum
    update; `lr` > 0; `momentum` beta in [0, 1); `staleness_power` >= 0."""

    period: int
    lr: float = DILOCO_LR
    momentum: float = DILOCO_MOMENTUM
    staleness_power: float = STALENESS_POWER
    arrivals: int = 0
    momentum_buffer: torch.Tensor | None = field(default=None, repr=False)
    pending: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.period, int) or isinstance(self.period, bool) or self.period < 1:
            raise OuterStepError(f"DelayedNesterov: period must be an integer >= 1, got {self.period!r}")
        checks = (("lr", self.lr, lambda v: v > 0, "> 0"),
                  ("momentum", self.momentum, lambda v: 0 <= v < 1, "in [0, 1)"),
                  ("staleness_power", self.staleness_power, lambda v: v >= 0, ">= 0"))
        for name, value, ok, bound in checks:
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or not ok(value):
                raise OuterStepError(f"DelayedNesterov: {name} must be a finite number {bound}, got {value!r}")

    def step(self, theta: torch.Tensor, gradient: torch.Tensor, staleness: int = 0) -> float:
        """Apply one arrival's outer `gradient` to `theta` in place; returns the weight it got."""
        if gradient.shape != theta.shape:
            raise OuterStepError(f"DelayedNesterov: gradient shape {tuple(gradient.shape)} != model "
                                 f"{tuple(theta.shape)}")
        weight = staleness_weight(staleness, self.staleness_power)
        weighted = gradient.to(torch.float32) * weight
        if self.momentum_buffer is None or self.pending is None:
            self.momentum_buffer = torch.zeros_like(theta, dtype=torch.float32)
            self.pending = torch.zeros_like(theta, dtype=torch.float32)
        self.arrivals += 1
        self.pending += weighted
        step = weighted / self.period
        if self.arrivals % self.period == 0:
            self.momentum_buffer.mul_(self.momentum).add_(self.pending / self.period)
            self.pending.zero_()
            step = step + self.momentum * self.momentum_buffer
        theta.sub_(self.lr * step)
        return weight

    def state_dict(self) -> dict[str, Any]:
        return {"arrivals": self.arrivals, "momentum_buffer": self.momentum_buffer, "pending": self.pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.arrivals = int(state["arrivals"])
        self.momentum_buffer = state["momentum_buffer"]
        self.pending = state["pending"]
