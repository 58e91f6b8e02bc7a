"""The runtime's transport: every byte between workers goes through here, and here it is timed.

The links are emulated by the process-group backend (geotrain.emulate): `use_emulated_links(config)`
installs it before `init_process_group`, so the runtime, user scripts and benchmarks share one emulator
(point-to-point FIFO links, ring all-reduce, ...; see docs/emulate.md) and the runtime's prediction
(the cost model) is checked against an independent model. The transport only times what it moves:

- point-to-point: a message is recorded from its emulated start on the link to its emulated arrival
  (the backend's clock); without emulation, from the send/receive call to its completion (wall clock);
- collectives (the data-parallel exchange): the emulated span of the group's collectives run inside
  `collective()` (from the latest member's start to the end), without emulation: a barrier of the
  group, then the wall time of the real collective.
Emulated seconds are multiplied by the time scale, the unit of the runtime's prediction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from geotrain.emulate import EmulatedProcessGroup, install
from geotrain.runtime.layout import Layout

T = TypeVar("T")


@dataclass(frozen=True)
class TransferRecord:
    """One received point-to-point message: start and end seconds, payload bytes."""

    kind: str  # "fwd" (activations) or "bwd" (activation gradients)
    cut: int  # stage cut s: between stage s and s + 1
    replica: int
    micro: int
    nbytes: int
    handoff_t: float
    end_t: float

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "cut": self.cut, "replica": self.replica, "micro": self.micro,
                "nbytes": self.nbytes, "handoff_t": self.handoff_t, "end_t": self.end_t}


@dataclass(frozen=True)
class CollectiveRecord:
    """One timed collective of a DP group: payload bytes per member, seconds (emulated x time scale)."""

    nbytes: int
    seconds: float
    emulated_s: float


def use_emulated_links(cluster: Any, layout: Layout, time_scale: float, compute_clock: str = "wall") -> None:
    """Make this process's `init_process_group("gloo")` emulate `cluster` (rank r on layout.slot(r)'s
    device); a time scale of 0 keeps plain gloo (no emulation: only the real transfer counts).
    `compute_clock`: how emulated time advances between operations (geotrain.emulate.install)."""
    if time_scale > 0:
        install(cluster, [layout.slot(r).device for r in range(layout.world_size)], time_scale,
                compute_clock=compute_clock)


class Transport:
    """Send/recv and timed collectives for one rank. Records what it moved."""

    def __init__(self, layout: Layout, rank: int, time_scale: float) -> None:
        self.layout = layout
        self.rank = rank
        self.time_scale = time_scale
        self._pending: list[Any] = []
        self.transfers: list[TransferRecord] = []
        self.collectives: list[CollectiveRecord] = []
        self.waiting_on: str | None = None  # what a blocked call waits for, for failure messages

    def send(self, data: torch.Tensor, dst_rank: int, tag: int) -> None:
        """Post a non-blocking send of a 1-D uint8 payload; `flush` waits for it."""
        self._pending.append(dist.isend(data, dst_rank, tag=tag))

    def recv(self, nbytes: int, src_rank: int, tag: int, *, kind: str, cut: int, micro: int) -> torch.Tensor:
        """Receive a `nbytes` payload from `src_rank` (the backend holds it until its emulated arrival)."""
        data = torch.empty(nbytes, dtype=torch.uint8)
        self.waiting_on = f"{kind} message {micro} of cut {cut} from rank {src_rank}"
        posted = time.time()
        work = dist.irecv(data, src_rank, tag=tag)
        work.wait()
        self.waiting_on = None
        span = getattr(work, "emulated_span", None)
        if span is not None:
            start, end = span[0] * self.time_scale, span[1] * self.time_scale
        else:
            start, end = posted, time.time()
        replica = self.layout.slot(self.rank).replica
        self.transfers.append(TransferRecord(kind, cut, replica, micro, nbytes, start, end))
        return data

    def flush(self) -> None:
        """Wait until every posted send has completed."""
        self.waiting_on = "completion of posted sends"
        for work in self._pending:
            work.wait()
        self._pending.clear()
        self.waiting_on = None

    def collective(self, group: Any, devices: list[int], nbytes: int, run: Callable[[], T]) -> T:
        """Run `run()` (the real collectives of `group`) and record its communication seconds."""
        if len(devices) < 2:
            result = run()
            self.collectives.append(CollectiveRecord(nbytes, 0.0, 0.0))
            return result
        self.waiting_on = f"the data-parallel group of devices {devices}"
        if isinstance(group, EmulatedProcessGroup):
            mark = len(group.spans)
            result = run()
            spans = group.spans[mark:]
            emulated = (spans[-1][2] - spans[0][1]) if spans else 0.0
            seconds = emulated * self.time_scale
        else:
            dist.barrier(group=group)
            start = time.time()
            result = run()
            seconds = emulated = time.time() - start
        self.waiting_on = None
        self.collectives.append(CollectiveRecord(nbytes, seconds, seconds))
        return result

    def take_records(self) -> tuple[list[TransferRecord], list[CollectiveRecord]]:
        """The records since the last call (one iteration's worth), clearing them."""
        transfers, collectives = self.transfers, self.collectives
        self.transfers, self.collectives = [], []
        return transfers, collectives
