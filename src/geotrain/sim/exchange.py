"""The simulated trainer's gradient exchange: p workers' flat gradients in, the aggregated gradient
and wire bytes out, through any geotrain.comm reducer (codec + error feedback, distributed PowerSGD,
...) over a SimulatedCollective that holds all p workers (sums in rank order).

The very reducer the DDP hooks and the runtime run: only the collective differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.codecs import Codec
from geotrain.comm import ReducerContext, SimulatedCollective, get_reducer


@dataclass(frozen=True)
class Exchanged:
    """The aggregated (mean) gradient as the receivers see it, and the bytes all workers handed."""

    gradient: torch.Tensor
    bytes_sent: int


class GradientExchange:
    """`exchange(worker_grads, step) -> Exchanged` for p simulated workers.

    named_shapes: the model's (name, shape) in parameter order, the order of the flat gradients.
    spec: a reducer spec or Codec (geotrain.comm.get_reducer); the codec reducer encodes the flat
    gradient as one tensor (granularity "flat"). bytes_sent: what every worker handed to the
    collectives (the ledger), times p."""

    def __init__(self, spec: str | Codec, named_shapes: Sequence[tuple[str, Sequence[int]]], workers: int,
                 error_feedback: bool = False, **params: Any) -> None:
        self.workers = workers
        self.collective = SimulatedCollective(workers)
        context = ReducerContext.of(named_shapes, workers, local_workers=workers, error_feedback=error_feedback)
        self.reducer = get_reducer(spec, context, **params)
        self._shapes = [shape for _, shape in context.named_shapes]
        self._sizes = [int(torch.Size(shape).numel()) for shape in self._shapes]

    def exchange(self, worker_grads: Sequence[torch.Tensor], step: int) -> Exchanged:
        if len(worker_grads) != self.workers:
            raise ValueError(f"expected {self.workers} worker gradients, got {len(worker_grads)}")
        before = self.collective.ledger.handed_bytes
        grads = [[piece.view(shape) for piece, shape in zip(flat.split(self._sizes), self._shapes, strict=True)]
                 for flat in worker_grads]
        means = self.reducer.reduce(grads, self.collective, step)
        gradient = torch.cat([mean.reshape(-1) for mean in means])
        return Exchanged(gradient, self.workers * (self.collective.ledger.handed_bytes - before))

    def state_dict(self) -> dict[str, Any]:
        """The reducer's state (every worker's residuals, PowerSGD's shared Q's...)."""
        return self.reducer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reducer.load_state_dict(state)
