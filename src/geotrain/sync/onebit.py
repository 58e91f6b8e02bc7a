"""1-bit Adam's synchronisation: OneBitAdam averages over the DP group itself (fp32 gradients in its
warm-up, error-compensated 1-bit momenta after), through a collective the transport times.

Clipping: the averaged gradient exists only during the warm-up, which is where OneBitAdam clips
(after the freeze its update is linear in the gradient: see geotrain.optim.onebit_adam); the norm is
reported only then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from geotrain.comm import TorchCollective
from geotrain.optim import OneBitAdam
from geotrain.sync.base import CollectivePause, GradientSync, StepTimer, SyncResult


class OneBitAdamSync(GradientSync):
    """Steps `optimizer` (which runs its own DP exchange on `collective`, whose calls run inside `pause()`:
    the compute timer counts the optimizer's work and leaves the collectives out)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], optimizer: OneBitAdam, collective: TorchCollective,
                 clip: float | None, pause: CollectivePause) -> None:
        self.params = list(params)
        self.optimizer = optimizer
        self.collective = collective
        self.clip = clip
        self.pause = pause

    def step(self, step: int, timer: StepTimer) -> SyncResult:
        before = self.collective.ledger.handed_bytes
        warmup = not self.optimizer.frozen
        with self.pause.timing(timer):
            self.optimizer.step()
        norm = self.optimizer.last_grad_norm if warmup and self.clip is not None else None
        return SyncResult(self.collective.ledger.handed_bytes - before, norm)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "exchange": None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
