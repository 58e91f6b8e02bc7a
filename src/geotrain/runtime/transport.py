"""The one transport layer: every byte between workers goes through here, and here it is slowed down
to the emulated link speed (see links.py) and timed.

Point-to-point: the sender stamps each message with its hand-off time and the emulated arrival time
of its link queue (16 header bytes, not counted as payload) and posts a non-blocking send; the
receiver, after the real transfer, sleeps until the emulated arrival. The measured duration of a
message is hand-off -> the moment the receiver holds it; if the receiver only asked for the data
after its emulated arrival (it was busy computing), the message is charged its emulated arrival
plus the real copy time measured from the receive call, not the receiver's lateness.

Collectives (the data-parallel exchange): a barrier of the group first (waiting for the slowest
member's compute is not communication), then the real collective, then a sleep until the emulated
scatter-gather all-reduce time has passed since the barrier. Wall clock (time.time) is used so that
timestamps from different processes of one machine compare.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist

from geotrain.runtime.layout import Layout
from geotrain.runtime.links import LinkModel, LinkQueue

T = TypeVar("T")
HEADER_BYTES = 16  # two float64: hand-off time, emulated arrival time


@dataclass(frozen=True)
class TransferRecord:
    """One received point-to-point message: seconds on the wall clock, payload bytes."""

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
    """One timed collective of a DP group: payload bytes per member, seconds after the barrier."""

    nbytes: int
    seconds: float
    emulated_s: float


class Backend(Protocol):
    """The real message passing under the transport (torch.distributed by default)."""

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Any:
        """Post a send; returns a handle with wait()."""
        ...

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> None: ...

    def barrier(self, group: Any) -> None: ...


class TorchDistBackend:
    """torch.distributed point-to-point and barrier (gloo in geotrain)."""

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Any:
        return dist.isend(tensor, dst, tag=tag)

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> None:
        dist.recv(tensor, src, tag=tag)

    def barrier(self, group: Any) -> None:
        dist.barrier(group=group)


def delivery(posted_t: float, received_t: float, arrival_t: float) -> tuple[float, float]:
    """(seconds to sleep, time the message counts as delivered) for a receive posted at `posted_t`
    whose real transfer ended at `received_t`, of a message the link delivers at `arrival_t`.

    Waiting receiver (posted <= arrival): hold the data until the emulated arrival, or longer if the
    real transfer was slower. Late receiver: no sleep; delivered at arrival + the real copy time."""
    if posted_t <= arrival_t:
        return max(0.0, arrival_t - received_t), max(received_t, arrival_t)
    return 0.0, arrival_t + (received_t - posted_t)


class Transport:
    """Emulated-link send/recv and timed collectives for one rank. Records what it moved."""

    def __init__(self, layout: Layout, links: LinkModel, rank: int, backend: Backend | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        self.layout = layout
        self.links = links
        self.rank = rank
        self.backend = backend if backend is not None else TorchDistBackend()
        self.clock = clock
        self.sleep = sleep
        self._queues: dict[int, LinkQueue] = {}
        self._pending: list[tuple[Any, torch.Tensor]] = []
        self.transfers: list[TransferRecord] = []
        self.collectives: list[CollectiveRecord] = []
        self.waiting_on: str | None = None  # what a blocked call waits for, for failure messages

    def _device(self, rank: int) -> int:
        return self.layout.slot(rank).device

    def _queue(self, dst_rank: int) -> LinkQueue:
        if dst_rank not in self._queues:
            self._queues[dst_rank] = LinkQueue(self.links, self._device(self.rank), self._device(dst_rank))
        return self._queues[dst_rank]

    def send(self, data: torch.Tensor, dst_rank: int, tag: int) -> None:
        """Post a non-blocking send of a 1-D uint8 payload; `flush` waits for it."""
        handoff = self.clock()
        arrival = self._queue(dst_rank).arrival(data.numel(), handoff)
        header = torch.tensor([handoff, arrival], dtype=torch.float64).view(torch.uint8)
        message = torch.cat([header, data])
        self._pending.append((self.backend.isend(message, dst_rank, tag), message))

    def recv(self, nbytes: int, src_rank: int, tag: int, *, kind: str, cut: int, micro: int) -> torch.Tensor:
        """Receive a `nbytes` payload from `src_rank`, hold it until its emulated arrival, record it."""
        message = torch.empty(HEADER_BYTES + nbytes, dtype=torch.uint8)
        self.waiting_on = f"{kind} message {micro} of cut {cut} from rank {src_rank}"
        posted = self.clock()
        self.backend.recv(message, src_rank, tag)
        received = self.clock()
        self.waiting_on = None
        handoff, arrival = (float(x) for x in message[:HEADER_BYTES].view(torch.float64))
        hold_s, end = delivery(posted, received, arrival)
        if self.links.time_scale == 0:  # no emulation: never sleep (clocks of two machines may disagree)
            hold_s, end = 0.0, received
        if hold_s > 0:
            self.sleep(hold_s)
            end = max(end, self.clock())  # the data reaches the schedule only now (sleep overshoot included)
        replica = self.layout.slot(self.rank).replica
        self.transfers.append(TransferRecord(kind, cut, replica, micro, nbytes, handoff, end))
        return message[HEADER_BYTES:]

    def flush(self) -> None:
        """Wait until every posted send has completed."""
        self.waiting_on = "completion of posted sends"
        for work, _message in self._pending:
            work.wait()
        self._pending.clear()
        self.waiting_on = None

    def collective(self, group: Any, devices: list[int], nbytes: int, run: Callable[[], T]) -> T:
        """Barrier, `run()` (the real collective), then sleep out the emulated all-reduce time of
        `nbytes` per member over `devices`; records the seconds after the barrier."""
        if len(devices) < 2:
            result = run()
            self.collectives.append(CollectiveRecord(nbytes, 0.0, 0.0))
            return result
        self.waiting_on = f"the data-parallel group of devices {devices}"
        self.backend.barrier(group)
        start = self.clock()
        result = run()
        emulated = self.links.allreduce_s(devices, nbytes)
        remaining = start + emulated - self.clock()
        if remaining > 0:
            self.sleep(remaining)
        self.waiting_on = None
        self.collectives.append(CollectiveRecord(nbytes, self.clock() - start, emulated))
        return result

    def take_records(self) -> tuple[list[TransferRecord], list[CollectiveRecord]]:
        """The records since the last call (one iteration's worth), clearing them."""
        transfers, collectives = self.transfers, self.collectives
        self.transfers, self.collectives = [], []
        return transfers, collectives
