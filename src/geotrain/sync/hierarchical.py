"""The per-step exchange through geotrain.comm.hierarchical (`--dp-hierarchical`).

The regions of a stage's DP group are the cluster regions of its devices (geotrain.comm.regions);
the flat stage gradient is averaged by a `HierarchicalReducer` (full precision inside regions, the
codec with per-shard-owner error feedback between them; the stage's parameters are the reducer's
segments, so codecs keep per-tensor scales). The exchange spans several process groups (the region's
and the shard owners'); the transport times them as one collective: the emulated span from the first
to the last collective of those groups, times the time scale; without emulation, wall time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from geotrain.codecs import Codec
from geotrain.comm.hierarchical import HierarchicalGroups, HierarchicalReducer
from geotrain.sync.base import CollectiveTransport, StepTimer, host_gradients, set_grads


class HierarchicalGradientExchange:
    """Averages the gradients of `params` over the stage's DP group hierarchically; holds the residuals.
    `group_devices`: the devices of the whole DP group (what the transport's record names)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], codec: Codec, error_feedback: bool,
                 transport: CollectiveTransport, groups: HierarchicalGroups, rank: int,
                 group_devices: list[int]) -> None:
        self.params = list(params)
        self.transport = transport
        self.groups = groups
        self.group_devices = list(group_devices)
        self.reducer = HierarchicalReducer(codec, groups, error_feedback=error_feedback,
                                           segments=[p.numel() for p in self.params], rank=rank)
        self.last_nbytes = 0

    def _process_groups(self) -> list[Any]:
        """This rank's region group and the shard owners' groups (None where a region has one member)."""
        return [g for g in (self.groups.intra[self.reducer.region], *self.groups.inter.values()) if g is not None]

    def _sent_bytes(self) -> int:
        self.last_nbytes = self.reducer.last_bytes.intra_bytes + self.reducer.last_bytes.inter_bytes
        return self.last_nbytes

    def exchange(self, step: int, timer: StepTimer) -> int:
        """Replace every gradient by the group mean; returns the bytes this rank sent (intra + inter)."""
        with timer:
            flat = torch.cat([grad.reshape(-1).float() for grad in host_gradients(self.params)])
        mean = self.transport.collective(self._process_groups(), self.group_devices, self._sent_bytes,
                                         lambda: self.reducer.all_reduce_mean(flat, step))
        with timer:
            offset, chunks = 0, []
            for p in self.params:
                chunks.append(mean[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            set_grads(self.params, chunks)
        return self.last_nbytes

    def state_dict(self) -> dict[str, Any]:
        return {"hierarchical": self.reducer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "hierarchical" not in state:
            raise ValueError("checkpoint was written without --dp-hierarchical")
        self.reducer.load_state_dict(state["hierarchical"])
