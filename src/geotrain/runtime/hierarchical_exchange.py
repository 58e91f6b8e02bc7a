"""`geotrain train --dp-hierarchical`: the stage's DP exchange through geotrain.comm.hierarchical.

The regions of a stage's DP group are the cluster regions of its devices (geotrain.comm.regions);
the flat stage gradient is averaged by a `HierarchicalReducer` (full precision inside regions, the
`--dp-codec` codec with per-shard-owner error feedback between them; the stage's parameters are the
reducer's segments, so codecs keep per-tensor scales). The communication time recorded for the
exchange is the emulated span from the first to the last collective of the hierarchy's groups (the
region group and the shard owners' groups), times the time scale; without emulation, wall time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from geotrain.codecs import Codec
from geotrain.comm.hierarchical import HierarchicalGroups, HierarchicalReducer
from geotrain.comm.regions import regions_of_devices
from geotrain.emulate import EmulatedProcessGroup
from geotrain.runtime.layout import Layout
from geotrain.runtime.transport import CollectiveRecord, Transport


def create_stage_hierarchies(layout: Layout, region_of_device: Sequence[int]) -> list[HierarchicalGroups]:
    """The hierarchy of every stage's DP group, created on every rank in stage order (torch's new_group rule)."""
    return [HierarchicalGroups.create(regions_of_devices(layout.dp_group_ranks(s), layout.dp_group_devices(s),
                                                         region_of_device))
            for s in range(layout.stages)]


class HierarchicalGradientExchange:
    """Averages the gradients of `params` over the stage's DP group hierarchically; holds the residuals."""

    def __init__(self, params: Sequence[torch.nn.Parameter], codec: Codec, error_feedback: bool,
                 transport: Transport, groups: HierarchicalGroups, rank: int) -> None:
        self.params = list(params)
        self.transport = transport
        self.groups = groups
        self.reducer = HierarchicalReducer(codec, groups, error_feedback=error_feedback,
                                           segments=[p.numel() for p in self.params], rank=rank)
        self.last_nbytes = 0

    def _process_groups(self) -> list[Any]:
        region = self.groups.intra[self.reducer.region]
        return [g for g in (region, *self.groups.inter.values()) if isinstance(g, EmulatedProcessGroup)]

    def exchange(self, step: int, timer: Any) -> int:
        """Replace every gradient by the group mean; returns the bytes this rank sent (intra + inter)."""
        with timer:
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                              for p in self.params])
        groups = self._process_groups()
        marks = [len(g.spans) for g in groups]
        started = time.time()
        mean = self.reducer.all_reduce_mean(flat, step)
        spans = [span for g, mark in zip(groups, marks, strict=True) for span in g.spans[mark:]]
        if groups:  # emulated links: the emulated span of the hierarchy's collectives
            seconds = (max(s[2] for s in spans) - min(s[1] for s in spans)) * self.transport.time_scale if spans else 0.0
        else:
            seconds = time.time() - started if self.reducer.world_size > 1 else 0.0
        self.last_nbytes = self.reducer.last_bytes.intra_bytes + self.reducer.last_bytes.inter_bytes
        self.transport.collectives.append(CollectiveRecord(self.last_nbytes, seconds, seconds))
        with timer:
            offset = 0
            for p in self.params:
                chunk = mean[offset:offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = chunk.clone()
                else:
                    p.grad.copy_(chunk)
                offset += p.numel()
        return self.last_nbytes

    def state_dict(self) -> dict[str, Any]:
        return {"hierarchical": self.reducer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "hierarchical" not in state:
            raise ValueError("checkpoint was written without --dp-hierarchical")
        self.reducer.load_state_dict(state["hierarchical"])
