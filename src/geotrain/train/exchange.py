"""Gradient exchange strategies: p workers' flat gradients in, the aggregated gradient and wire bytes out.

A strategy is a small object with `exchange(worker_grads, step) -> Exchanged`. `CodecExchange` is the
seed's scheme: every worker encodes its gradient with a codec (optionally through its own error
feedback), the receiver decodes each payload and averages. The bytes are the payloads' real sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from geotrain.codecs import Codec, ErrorFeedback


@dataclass(frozen=True)
class Exchanged:
    """The aggregated (mean) gradient as the receiver sees it, and the wire bytes all workers sent."""

    gradient: torch.Tensor
    bytes_sent: int


class GradientExchange(Protocol):
    def exchange(self, worker_grads: Sequence[torch.Tensor], step: int) -> Exchanged: ...


class CodecExchange:
    """Each worker sends codec.encode(grad) (or through its ErrorFeedback); the receiver averages the decodes."""

    def __init__(self, codec: Codec, workers: int, error_feedback: bool = False) -> None:
        self.codec = codec
        self.workers = workers
        self.feedback = [ErrorFeedback(codec) for _ in range(workers)] if error_feedback else None

    def exchange(self, worker_grads: Sequence[torch.Tensor], step: int) -> Exchanged:
        if len(worker_grads) != self.workers:
            raise ValueError(f"expected {self.workers} worker gradients, got {len(worker_grads)}")
        self.codec.set_step(step)  # seeded codecs (randk, powersgd) agree on their randomness per step
        total = torch.zeros_like(worker_grads[0])
        bytes_sent = 0
        for rank, grad in enumerate(worker_grads):
            sender = self.codec if self.feedback is None else self.feedback[rank]
            payload = sender.encode(grad)
            bytes_sent += payload.nbytes
            total.add_(self.codec.decode(payload))
        return Exchanged(total.div_(self.workers), bytes_sent)

    def state_dict(self) -> dict[str, Any]:
        """Error-feedback residuals per worker (empty without error feedback)."""
        return {"feedback": [] if self.feedback is None else [f.state_dict() for f in self.feedback]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.feedback is not None:
            for feedback, saved in zip(self.feedback, state["feedback"], strict=True):
                feedback.load_state_dict(saved)
