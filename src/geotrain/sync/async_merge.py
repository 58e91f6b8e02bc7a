"""How asynchronous DiLoCo's server treats an arriving outer gradient before its outer optimizer applies it
(`--async-merge`; geotrain.sync.async_server calls it once per applied update).

- "staleness" (the default): the gradient as it came; delayed Nesterov weighs it (1 + s) ** -P
  (`--async-staleness-power`, default 0: full weight, as the inner steps it carries).
- "heloco" (after HeLoCo, Al Asif et al. 2026): a stale gradient (s > 0) loses its component that opposes
  the server's recent update direction r, and is kept whole where it is aligned:

      r      <- decay r + u                        (u: the update the server just applied, theta before - after)
      g'      = g - min(0, <g, r>) / <r, r> r      (s > 0 and <r, r> > 0; else g' = g)

  so <g', r> >= 0 and |g'| <= |g|: a replica that computed from a model several versions old no longer pulls the
  model back along the way the fresher replicas moved it. HeLoCo takes the outer momentum as r; the bench's outer
  averaging has none (momentum 0), so r is this running sum of applied updates (a momentum of the server's own
  steps, whatever the outer optimizer's). The paper works per tensor block; the server holds the model flat, so
  here the whole model is one block.

`MergingOptimizer` puts the rule in front of a server's outer optimizer (geotrain.optim.delayed_nesterov): the
server calls its `step` per applied update as it calls the optimizer's. All tensors are flat float32; the
reference's state is explicit (`state_dict`) and is saved with the optimizer's, in the server's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from geotrain.optim.delayed_nesterov import DelayedNesterov
from geotrain.sync.base import SyncError

ASYNC_MERGES = ("staleness", "heloco")
"""`--async-merge`: the arriving gradient as it came, or HeLoCo's direction-aware correction (module doc)."""
REFERENCE_DECAY = 0.9
"""HeLoCo's reference r: the decay of the running sum of applied updates (the outer Nesterov momentum's usual
0.9: r weighs about the last 10 updates)."""


def remove_opposing(gradient: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """`gradient` without its component along `reference` when the two point apart (<g, r> < 0), else `gradient`
    itself (also when the reference is zero). Flat float32 tensors of one shape."""
    if gradient.shape != reference.shape:
        raise SyncError(f"async merge: gradient shape {tuple(gradient.shape)} != reference {tuple(reference.shape)}")
    norm2 = float(reference.double().square().sum())
    dot = float((gradient.double() * reference.double()).sum())
    if dot >= 0 or norm2 == 0:
        return gradient
    return gradient - (dot / norm2) * reference


@dataclass
class AsyncMerge:
    """One server's merge rule (module doc): `mode` of ASYNC_MERGES, `decay` of HeLoCo's reference in [0, 1)."""

    mode: str = "staleness"
    decay: float = REFERENCE_DECAY
    reference: torch.Tensor | None = field(default=None, repr=False)
    corrected: int = 0
    """Stale gradients that had an opposing component removed."""

    def __post_init__(self) -> None:
        if self.mode not in ASYNC_MERGES:
            raise SyncError(f"async merge must be one of {', '.join(ASYNC_MERGES)}, got {self.mode!r}")
        if isinstance(self.decay, bool) or not isinstance(self.decay, int | float) or not math.isfinite(self.decay) \
                or not 0 <= self.decay < 1:
            raise SyncError(f"async merge: decay must be a number in [0, 1), got {self.decay!r}")

    def correct(self, gradient: torch.Tensor, staleness: int) -> torch.Tensor:
        """The gradient the outer optimizer applies for one arrival `staleness` versions stale."""
        if self.mode == "staleness" or staleness <= 0 or self.reference is None:
            return gradient
        corrected = remove_opposing(gradient, self.reference)
        self.corrected += corrected is not gradient
        return corrected

    def observe(self, before: torch.Tensor, after: torch.Tensor) -> None:
        """Fold the update the server just applied (model `before` - `after`) into the reference."""
        if self.mode == "staleness":
            return
        applied = (before - after).to(torch.float32)
        self.reference = applied if self.reference is None else self.reference.mul_(self.decay).add_(applied)

    def state_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "reference": None if self.reference is None else self.reference.clone(),
                "corrected": self.corrected}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["mode"] != self.mode:
            raise ValueError(f"checkpoint's async merge is {state['mode']!r}, this run's {self.mode!r}")
        self.reference = None if state["reference"] is None else state["reference"].clone()
        self.corrected = int(state["corrected"])


class MergingOptimizer:
    """A server's outer optimizer behind its merge rule: `step` corrects the arriving gradient (AsyncMerge.correct),
    applies it with `optimizer` and folds the applied update into the rule's reference. DelayedNesterov's interface."""

    def __init__(self, optimizer: DelayedNesterov, merge: AsyncMerge) -> None:
        self.optimizer = optimizer
        self.merge = merge

    def step(self, theta: torch.Tensor, gradient: torch.Tensor, staleness: int = 0) -> float:
        """Apply one arrival's outer `gradient` (`staleness` versions stale) to `theta` in place; its weight."""
        corrected = self.merge.correct(gradient, staleness)
        before = theta.clone() if self.merge.mode != "staleness" else theta
        weight = self.optimizer.step(theta, corrected, staleness)
        self.merge.observe(before, theta)
        return weight

    def state_dict(self) -> dict[str, Any]:
        return {**self.optimizer.state_dict(), "merge": self.merge.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
        if "merge" in state:
            self.merge.load_state_dict(state["merge"])


def outer_optimizer(merge: str, period: int, lr: float, momentum: float, staleness_power: float
                    ) -> DelayedNesterov | MergingOptimizer:
    """A server's outer optimizer: delayed Nesterov (`period` arrivals per momentum update, `lr`, `momentum`,
    `staleness_power`), behind the `merge` rule of ASYNC_MERGES unless it is "staleness" (the gradient as it came)."""
    optimizer = DelayedNesterov(period, lr, momentum, staleness_power)
    return optimizer if merge == "staleness" else MergingOptimizer(optimizer, AsyncMerge(merge))
