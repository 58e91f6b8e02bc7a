"""A posted outer exchange waited for early, at a checkpoint, and applied when it was due.

An overlapped outer sync (Streaming DiLoCo's delay, adaptive local steps' delay) posts its collective and lands
it some inner steps later. A checkpoint that falls in between "settles" it: every rank waits for the posted
collective now and decodes it (the wait is exposed, one exchange's latency per checkpoint), and the means it
delivered are kept (`Delivered`: per parameter, the local shard's tensor) until the step it was due to land,
where they are applied exactly as the landing would have applied them. Waiting early changes no number, so a
run with checkpoints computes what the run without them does, and a run resumed from one continues it: the
delivered means are part of the sync's state_dict (the alternative, draining: applying the landing at the
checkpoint, would change the schedule and need the same cadence in the reference run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.sync.base import StepTimer, set_grads


@dataclass
class Delivered:
    """What a posted exchange delivered: the bytes this rank handed to it and, per group of shadow parameters
    (outer gradients; moment sync's first and second moments), the means written into their gradients."""

    nbytes: int
    means: list[list[torch.Tensor]]

    def state_dict(self) -> dict[str, Any]:
        return {"bytes": self.nbytes, "means": [[m.clone() for m in group] for group in self.means]}

    @classmethod
    def of(cls, state: dict[str, Any]) -> Delivered:
        return cls(int(state["bytes"]), [list(group) for group in state["means"]])


def settle(land: Callable[[StepTimer], int], timer: StepTimer,
           groups: Sequence[Sequence[torch.nn.Parameter]]) -> Delivered:
    """Wait for a posted exchange (`land`: writes the means into the gradients of `groups`' shadow parameters and
    returns the bytes handed) and keep what it delivered."""
    nbytes = land(timer)
    means = [[p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in group]
             for group in groups]
    return Delivered(nbytes, means)


def redeliver(delivered: Delivered, groups: Sequence[Sequence[torch.nn.Parameter]]) -> Callable[[StepTimer], int]:
    """The landing of a settled exchange: writes the kept means back into `groups`' gradients (a resumed run's
    shadows hold nothing yet) and returns the bytes it handed when it was posted."""
    if len(groups) != len(delivered.means) or any(
            len(g) != len(m) or any(p.shape != t.shape for p, t in zip(g, m, strict=True))
            for g, m in zip(groups, delivered.means, strict=True)):
        raise ValueError("checkpoint's in-flight outer sync does not match this sync's parameters (shapes differ)")

    def land(timer: StepTimer) -> int:
        for group, means in zip(groups, delivered.means, strict=True):
            set_grads(group, means)
        return delivered.nbytes

    return land
