"""Local SGD / DiLoCo (geotrain.optim.outer): each replica steps its inner optimizer on its own
gradients; every H steps (and at the run's last step) the replicas average the outer gradients
(anchor - parameters) through an exchange, and the outer optimizer steps the anchor.

With a hierarchy (`inner_exchange`: the region's members averaging their gradients every step at full
precision) each region is one worker, and only the regions exchange outer gradients.

Extension point: `_outer_sync(step, timer)` is the whole schedule of outer synchronisation; a
streaming variant (fragments synchronised at staggered offsets, results applied some steps later)
overrides it with per-fragment OuterSteps and exchanges, and keeps the inner loop as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from geotrain.optim.outer import OuterStep
from geotrain.sync.base import DPExchange, GradientSync, StepTimer, SyncResult


class OuterSync(GradientSync):
    """Inner steps on local (or region-mean) gradients; every `outer.sync_every` steps an outer sync."""

    def __init__(self, params: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer, outer: OuterStep,
                 exchange: DPExchange, total_steps: int, inner_exchange: DPExchange | None = None) -> None:
        """`exchange`: averages the outer gradients over the DP group (written into the gradients);
        `inner_exchange`: averages the gradients every step before the inner step (a region), or None."""
        self.params = list(params)
        self.optimizer = optimizer
        self.outer = outer
        self.exchange = exchange
        self.total_steps = total_steps
        self.inner_exchange = inner_exchange

    def step(self, step: int, timer: StepTimer) -> SyncResult:
        inner_bytes = 0 if self.inner_exchange is None else self.inner_exchange.exchange(step, timer)
        with timer:
            self.optimizer.step()
        return SyncResult(inner_bytes + self._outer_sync(step, timer), None)

    def _outer_sync(self, step: int, timer: StepTimer) -> int:
        """Blocking DiLoCo: when an outer period ends, average the outer gradients and step the anchor.
        Returns the bytes handed to the DP group's collectives."""
        if not self.outer.due(step, self.total_steps):
            return 0
        self._sync_started(step)
        with timer:
            for p, outer_gradient in zip(self.params, self.outer.outer_gradients(), strict=True):
                p.grad = outer_gradient.to(p.dtype)
        dp_bytes = self.exchange.exchange(step, timer)
        with timer:
            self.outer.apply([p.grad for p in self.params])
        self._sync_landed(step, dp_bytes)
        return dp_bytes

    def fingerprint(self) -> float:
        """The anchor's float64 sum (the parameters differ between synchronisations)."""
        return self.outer.anchor_sum()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "exchange": self.exchange.state_dict(),
                "outer": self.outer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if "outer" not in state:
            raise ValueError("checkpoint was written without --sync-every")
        self.outer.load_state_dict(state["outer"])
        self.exchange.load_state_dict(state["exchange"])
