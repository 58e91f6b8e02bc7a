"""Gradient exchange strategies: p workers' flat gradients in, the aggregated gradient and wire bytes out.

A strategy is a small object with `exchange(worker_grads, step) -> Exchanged`. `CodecExchange` is the
seed's scheme: every worker encodes its gradient with a codec (optionally through its own error
feedback), the receiver decodes each payload and averages. The bytes are the payloads' real sizes.
`PowerSGDExchange` is distributed PowerSGD (shared basis: mean of P, then of Q), the same algorithm
object as the DDP hook (`geotrain.ddp.PowerSGDReducer`) with p workers in one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from geotrain.codecs import Codec, ErrorFeedback
from geotrain.ddp.powersgd import PowerSGDConfig, PowerSGDLayout, PowerSGDReducer


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


class PowerSGDExchange:
    """Distributed PowerSGD over p simulated workers: what `register_codec_hook(ddp, "powersgd")` does
    across p processes. `named_shapes`: the model's (name, shape) in parameter order, the order of the
    flat gradients. bytes_sent: what every worker hands to the two all-reduces (fp32 P's and
    uncompressed values, then Q's), times p, as the other exchanges count payloads.
    The collective sums the workers' buffers in rank order, as gloo does with 2 processes."""

    def __init__(self, named_shapes: Sequence[tuple[str, Sequence[int]]], workers: int,
                 config: PowerSGDConfig | None = None) -> None:
        self.config = config or PowerSGDConfig()
        self.workers = workers
        self.layout = PowerSGDLayout.build(named_shapes, self.config)
        self.reducer = PowerSGDReducer(self.layout, self.config, workers, local_workers=workers)
        self._sizes = [self.layout.numel(i) for i in range(len(self.layout.names))]

    def exchange(self, worker_grads: Sequence[torch.Tensor], step: int) -> Exchanged:
        if len(worker_grads) != self.workers:
            raise ValueError(f"expected {self.workers} worker gradients, got {len(worker_grads)}")
        declared_before = self.reducer.declared_bytes
        grads = [[piece.view(shape) for piece, shape in zip(flat.split(self._sizes), self.layout.shapes, strict=True)]
                 for flat in worker_grads]
        means = self.reducer.reduce(grads, _sum_in_rank_order)
        gradient = torch.cat([mean.reshape(-1) for mean in means])
        return Exchanged(gradient, self.workers * (self.reducer.declared_bytes - declared_before))

    def state_dict(self) -> dict[str, Any]:
        """Step, shared Q's and every worker's residuals (see PowerSGDReducer.state_dict)."""
        return self.reducer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reducer.load_state_dict(state)


def _sum_in_rank_order(flats: list[torch.Tensor]) -> torch.Tensor:
    total = torch.zeros_like(flats[0])
    for flat in flats:
        total.add_(flat)
    return total
