"""The per-step exchange through geotrain.comm.hierarchical (`--dp-hierarchical`).

The regions of a stage's DP group are the cluster regions of its devices (geotrain.comm.regions);
the flat stage gradient is averaged by a `HierarchicalReducer` (full precision inside regions, the
codec with per-shard-owner error feedback between them; the stage's parameters are the reducer's
segments, so codecs keep per-tensor scales). The exchange spans several process groups (the region's
and the shard owners'); the transport times them as one collective: the emulated span from the first
to the last collective of those groups, times the time scale; without emulation, wall time.

Posted (`start`, for a delay: Streaming DiLoCo's tau, delayed gradients): the region's reduce-scatter and the
encoding run at once (a record of no bytes: the intra-region step), the inter-region all-gathers are posted and
travel while the inner steps go on; the returned function waits for them, decodes and runs the region's
all-gather, recorded as a posted collective (geotrain.runtime.transport) with all of the exchange's bytes. Its
result is the blocking exchange's, bit for bit (`HierarchicalReducer.all_reduce_mean` is the same two halves).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.codecs import Codec, CodecSpec
from geotrain.comm.hierarchical import HierarchicalGroups, HierarchicalReducer
from geotrain.sync.base import CollectiveTransport, DPExchange, StepTimer, SyncError, host_gradients, set_grads
from geotrain.sync.exchange import ExtraTensors
from geotrain.sync.moments import MomentTensors, moment_parts


def region_process_groups(groups: HierarchicalGroups, region: int) -> list[Any]:
    """The process groups an exchange of a member of `region` runs on: its region's group and the shard owners'
    groups (none where a region has one member), which the transport times as one collective."""
    return [g for g in (groups.intra[region], *groups.inter.values()) if g is not None]


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
        return region_process_groups(self.groups, self.reducer.region)

    def _sent_bytes(self) -> int:
        self.last_nbytes = self.reducer.last_bytes.intra_bytes + self.reducer.last_bytes.inter_bytes
        return self.last_nbytes

    def exchange(self, step: int, timer: StepTimer, parts: int | None = None) -> int:
        """Replace every gradient by the group mean; returns the bytes this rank sent (intra + inter).
        `parts`: None or 1 (this exchange carries one part: the parameters)."""
        flat = self._flat(timer, parts)
        mean = self.transport.collective(self._process_groups(), self.group_devices, self._sent_bytes,
                                         lambda: self.reducer.all_reduce_mean(flat, step))
        self._write(mean, timer)
        return self.last_nbytes

    def start(self, step: int, timer: StepTimer, parts: int | None = None) -> Callable[[StepTimer], int]:
        """`exchange` in two halves (module doc): post now; the returned function waits, writes the means into
        the gradients and returns the bytes this rank sent (pass it the timer of the step it runs in)."""
        flat = self._flat(timer, parts)
        finish = self.transport.collective(self._process_groups(), self.group_devices, 0,
                                           lambda: self.reducer.start_all_reduce_mean(flat, step))

        def land(landing_timer: StepTimer = timer) -> int:
            mean = self.transport.collective(self._process_groups(), self.group_devices, self._sent_bytes, finish,
                                             posted=True)
            self._write(mean, landing_timer)
            return self.last_nbytes

        return land

    def _flat(self, timer: StepTimer, parts: int | None) -> torch.Tensor:
        """The gradients as one flat float32 vector."""
        if parts not in (None, 1):
            raise SyncError(f"HierarchicalGradientExchange carries one part (the parameters), got parts {parts!r}")
        with timer:
            return torch.cat([grad.reshape(-1).float() for grad in host_gradients(self.params)])

    def _write(self, mean: torch.Tensor, timer: StepTimer) -> None:
        """Write the flat `mean` into the parameters' gradients."""
        with timer:
            offset, chunks = 0, []
            for p in self.params:
                chunks.append(mean[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            set_grads(self.params, chunks)

    def state_dict(self) -> dict[str, Any]:
        return {"hierarchical": self.reducer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "hierarchical" not in state:
            raise ValueError("checkpoint was written without --dp-hierarchical")
        self.reducer.load_state_dict(state["hierarchical"])


class HierarchicalPartsExchange:
    """Several HierarchicalGradientExchanges, one per part (moment sync, geotrain.sync.moments: the outer gradients,
    then the moments, each through its own codec and residuals), run back to back on the same groups; `parts` k
    sends the first k only (StageExchange's contract)."""

    def __init__(self, parts: Sequence[HierarchicalGradientExchange]) -> None:
        self.parts = list(parts)

    def _first(self, parts: int | None) -> list[HierarchicalGradientExchange]:
        if parts is None:
            return self.parts
        if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= len(self.parts):
            raise SyncError(f"HierarchicalPartsExchange: parts must be an integer in 1..{len(self.parts)}, "
                            f"got {parts!r}")
        return self.parts[:parts]

    def exchange(self, step: int, timer: StepTimer, parts: int | None = None) -> int:
        """Each of the first `parts` parts' exchange (None: all); the bytes this rank sent."""
        return sum(part.exchange(step, timer) for part in self._first(parts))

    def start(self, step: int, timer: StepTimer, parts: int | None = None) -> Callable[[StepTimer], int]:
        """Each of the first `parts` parts posted; the returned function lands them all (in order)."""
        lands = [part.start(step, timer) for part in self._first(parts)]
        return lambda landing_timer=timer: sum(land(landing_timer) for land in lands)

    def state_dict(self) -> dict[str, Any]:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state.get("parts", ())) != len(self.parts):
            raise ValueError(f"checkpoint holds no hierarchical exchange of {len(self.parts)} parts")
        for part, saved in zip(self.parts, state["parts"], strict=True):
            part.load_state_dict(saved)


def hierarchical_exchange(named_params: Sequence[tuple[str, torch.nn.Parameter]], codec: CodecSpec,
                          error_feedback: bool, transport: CollectiveTransport, groups: HierarchicalGroups, rank: int,
                          group_devices: list[int], moments: MomentTensors | None = None) -> DPExchange:
    """The hierarchical exchange of `named_params` through `codec`; with `moments` (moment sync) one per part, the
    moments' parts after them (geotrain.sync.moments.moment_parts)."""
    parts = [ExtraTensors(list(named_params), codec, error_feedback)]
    if moments is not None:
        parts += moment_parts(moments, codec, error_feedback)
    exchanges = [HierarchicalGradientExchange([p for _, p in part.named_params], part.codec.build(),
                                              part.error_feedback, transport, groups, rank, group_devices)
                 for part in parts]
    return exchanges[0] if moments is None else HierarchicalPartsExchange(exchanges)
