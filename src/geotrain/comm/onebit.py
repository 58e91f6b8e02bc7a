"""The error-compensated 1-bit average of one flat vector per worker (Tang et al. 2021), the
communication of 1-bit Adam's compression stage (its momentum), as a reducer.

    worker i: x = v_i + e_i;  send chunk j of sign(x) * scales to rank j;  e_i = x - what it sent
    rank j:   y = mean of the p decoded chunks j + s_j;  s_j = y - compressed(y);  all-gather
so every worker ends with the same average. Chunks and messages: `OneBitLayout`. Bytes per worker
per call: (p + 1) x message_bytes ~ n/8 (1 + 1/p) (one all-to-all, one all-gather).

`average` computes the result and the new residuals without changing the reducer, `commit` stores
the residuals: a caller that refuses a step (OneBitAdam on NaN/inf) leaves the state as it was.
`reduce` (the reducer protocol, see geotrain.comm) does both. Registered as `onebit`.

`device`: where the residuals live and the encoding runs (the layout's); the collective carries the messages
(a TorchCollective with `host_copies` hands host copies to gloo).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from geotrain.comm.collectives import Collective
from geotrain.comm.onebit_layout import OneBitLayout

Residuals = tuple[list[torch.Tensor], list[torch.Tensor]]
"""(worker residuals, padded_numel each; server residuals, chunk_numel each), one per local worker."""


class OneBitMomentumReducer:
    """1-bit error-compensated averaging of a flat vector of `sum(param_numels)` values."""

    name = "onebit"
    whole_model = True

    def __init__(self, param_numels: Sequence[int], world_size: int, local_workers: int = 1,
                 device: torch.device | str = "cpu") -> None:
        self.layout = OneBitLayout(param_numels, world_size, device)
        self.local_workers = local_workers
        self.worker_errors = [torch.zeros(self.layout.padded_numel, device=device) for _ in range(local_workers)]
        self.server_errors = [torch.zeros(self.layout.chunk_numel, device=device) for _ in range(local_workers)]
        self.declared_bytes = 0

    def step_bytes(self) -> int:
        """Bytes one worker hands to the process group per call."""
        return (self.layout.world_size + 1) * self.layout.message_bytes

    def average(self, vectors: Sequence[torch.Tensor], collective: Collective) -> tuple[torch.Tensor, Residuals]:
        """The 1-bit average of one flat float32 vector per local worker (in `collective.local_ranks`
        order) and the new residuals; the reducer is unchanged until `commit`."""
        layout, p = self.layout, self.layout.world_size
        sends, worker_errors, server_errors = [], [], []
        for i, vector in enumerate(vectors):
            x = layout.pad(vector) + self.worker_errors[i]
            messages, decoded = zip(*(layout.encode_chunk(layout.chunk(x, j), j) for j in range(p)), strict=True)
            worker_errors.append(x - torch.cat(decoded))
            sends.append(torch.cat(messages))
        received = collective.all_to_all(sends)
        replies = []
        for i, (rank, inbox) in enumerate(zip(collective.local_ranks, received, strict=True)):
            total = torch.zeros(layout.chunk_numel, device=layout.device)
            for message in inbox.view(p, -1):  # rank order, so the sum is deterministic
                total += layout.decode_chunk(message, rank)
            y = total.div_(p) + self.server_errors[i]
            reply, decoded_reply = layout.encode_chunk(y, rank)
            server_errors.append(y - decoded_reply)
            replies.append(reply)
        gathered = collective.all_gather(replies).view(p, -1)
        averaged = torch.cat([layout.decode_chunk(gathered[j], j) for j in range(p)])
        self.declared_bytes += self.step_bytes()
        return averaged[: layout.numel].clone(), (worker_errors, server_errors)

    def commit(self, residuals: Residuals) -> None:
        self.worker_errors, self.server_errors = residuals

    def relaid(self, world_size: int, rank: int, param_numels: Sequence[int]) -> OneBitMomentumReducer:
        """A reducer of one local worker on the layout of `world_size` ranks (this one's worker was rank `rank` of
        p = layout.world_size; an elastic quorum that changed: geotrain.sync.elastic_onebit), which has delivered the
        same: what this worker and its chunk have not yet delivered to the mean, e / p + s (its worker residual e, its
        chunk's server residual s), becomes its new worker residual's share e' / world_size, so
        e' = e x world_size / p + s x world_size (the server residual starts at zero); the worker's next encoding
        carries it to whoever owns those values now, with its error feedback."""
        if self.local_workers != 1:
            raise ValueError(f"relaid: one local worker only, this reducer has {self.local_workers}")
        layout, numel = self.layout, self.layout.numel
        carry = self.worker_errors[0] * (world_size / layout.world_size)
        carry[rank * layout.chunk_numel: (rank + 1) * layout.chunk_numel] += world_size * self.server_errors[0]
        relaid = OneBitMomentumReducer(param_numels, world_size, 1, layout.device)
        relaid.worker_errors = [relaid.layout.pad(carry[:numel])]
        relaid.declared_bytes = self.declared_bytes
        return relaid

    def reduce(self, worker_grads: Sequence[Sequence[torch.Tensor]], collective: Collective,
               step: int | None = None) -> list[torch.Tensor]:
        """The reducer protocol: each local worker's tensors, flattened and concatenated, averaged in 1 bit."""
        flats = [torch.cat([t.detach().reshape(-1).float() for t in tensors]) for tensors in worker_grads]
        averaged, residuals = self.average(flats, collective)
        self.commit(residuals)
        return [piece.view_as(t).to(t.dtype) for piece, t in
                zip(averaged.split([t.numel() for t in worker_grads[0]]), worker_grads[0], strict=True)]

    def state_dict(self) -> dict[str, Any]:
        return {"worker_errors": [e.clone() for e in self.worker_errors],
                "server_errors": [e.clone() for e in self.server_errors]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = [self.layout.padded_numel] * self.local_workers + [self.layout.chunk_numel] * self.local_workers
        found = [t.numel() if isinstance(t, torch.Tensor) else None
                 for t in [*state.get("worker_errors", []), *state.get("server_errors", [])]]
        if found != expected:
            raise ValueError(f"1-bit residuals of sizes {found[:4]} do not fit this reducer ({expected[:4]})")
        self.worker_errors = [e.to(self.layout.device, copy=True) for e in state["worker_errors"]]
        self.server_errors = [e.to(self.layout.device, copy=True) for e in state["server_errors"]]
