"""The runtime's transport: the timing of every byte between workers.

The links are emulated by the process-group backend (geotrain.emulate): `use_emulated_links(config)`
installs it before `init_process_group`, so the runtime, user scripts and benchmarks share one emulator
(point-to-point FIFO links, ring all-reduce, ...; see docs/history/emulate.md) and the runtime's prediction
(the cost model) is checked against an independent model. The transport times:

- point-to-point (torch.distributed.pipelining sends them): each message this rank sent, from its
  emulated start on the link to its emulated arrival, as the emulator recorded it; without
  emulation none are recorded (torch owns the calls);
- collectives (the data-parallel exchange, geotrain.sync): the emulated span of the group's
  collectives run inside `collective()` (from the latest member's start to the end), without
  emulation: a barrier of the group, then the wall time of the real collective. An exchange over
  several groups (the hierarchical all-reduce: a region's group and the shard owners') is one call
  with all of them: the span from the first to the last of their collectives; without emulation, its
  wall time (no barrier: no one group holds every member);
- posted collectives (Streaming DiLoCo's overlapped exchange, geotrain.sync.streaming): one record
  when the posted work is waited for (`collective(..., posted=True)`), its bytes those handed when it
  was posted (DP bytes like any other), its seconds: emulated, the collective's span on the links
  (which overlapped the compute since it was posted); without emulation, the wall time this rank
  waited (no barrier: that would undo the overlap).
Emulated seconds are multiplied by the time scale, the unit of the runtime's prediction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch.distributed as dist

from geotrain.emulate import EmulatedProcessGroup, install
from geotrain.emulate.install import Emulation
from geotrain.emulate.schedule import inter_region_traffic
from geotrain.runtime.layout import Layout

T = TypeVar("T")
StepMark = tuple[float, int, float]  # (this rank's emulated clock s, transfers it has sent so far, its waited_s)


@dataclass(frozen=True)
class TransferRecord:
    """One point-to-point message this rank sent, on the directed link to a neighbouring stage's rank:
    "fwd" towards a later stage (cut = this rank's stage), "bwd" towards an earlier one (cut = its stage)."""

    kind: str
    cut: int
    replica: int
    seq: int  # the sender's message count
    nbytes: int
    handoff_t: float  # emulated start on the link, x time scale
    end_t: float  # emulated arrival, x time scale

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "cut": self.cut, "replica": self.replica, "seq": self.seq,
                "nbytes": self.nbytes, "handoff_t": self.handoff_t, "end_t": self.end_t}


@dataclass(frozen=True)
class CollectiveRecord:
    """One timed collective of a DP group: payload bytes per member, seconds (emulated x time scale);
    `posted`: an overlapped collective, recorded when it was waited for (module doc)."""

    nbytes: int
    seconds: float
    emulated_s: float
    posted: bool = False


def use_emulated_links(cluster: Any, layout: Layout, time_scale: float, compute_clock: str = "wall",
                       compute_scale: Sequence[float] | None = None) -> Emulation | None:
    """Make this process's `init_process_group("gloo")` emulate `cluster` (rank r on layout.slot(r)'s
    device); a time scale of 0 keeps plain gloo (no emulation: only the real transfer counts).
    `compute_clock`: how emulated time advances between operations; `compute_scale`: per device, the
    factor on measured compute (geotrain.emulate.install)."""
    if time_scale > 0:
        return install(cluster, [layout.slot(r).device for r in range(layout.world_size)], time_scale,
                       compute_clock=compute_clock, compute_scale=compute_scale)
    return None


class Transport:
    """Send/recv and timed collectives for one rank. Records what it moved."""

    def __init__(self, layout: Layout, rank: int, time_scale: float) -> None:
        self.layout = layout
        self.rank = rank
        self.time_scale = time_scale
        self.collectives: list[CollectiveRecord] = []
        self.waiting_on: str | None = None  # what a blocked call waits for, for failure messages

    def step_mark(self, emulation: Emulation | None) -> StepMark | None:
        """This rank's emulated clock (s), count of transfers sent and seconds blocked on links so far
        (RankClock.waited_s), now (None without emulation)."""
        if emulation is None:
            return None
        state = emulation.state()
        with state.lock:
            return state.clock.now(), len(state.transfers), state.clock.waited_s

    def busy_since(self, emulation: Emulation | None, mark: StepMark | None) -> float | None:
        """Emulated seconds this rank's clock advanced since `mark` by its own work, not blocked on links:
        timed compute and the host work around it (torch's schedule between chunks, the step's bookkeeping),
        which the emulated clock counts alike (None without emulation)."""
        if emulation is None or mark is None:
            return None
        state = emulation.state()
        with state.lock:
            return (state.clock.now() - mark[0]) - (state.clock.waited_s - mark[2])

    def step_span(self, emulation: Emulation | None, mark: StepMark | None,
                  region_of: Sequence[int]) -> dict[str, Any] | None:
        """Since `mark`: the emulated start/end seconds of this rank's clock (compute at real speed,
        links as emulated), `busy_s` (busy_since), the payload bytes it sent, all and between devices of
        different regions (`region_of[device]`), and when those left: `inter_region_wire`
        (schedule.inter_region_traffic); None without emulation."""
        if emulation is None or mark is None:
            return None
        state = emulation.state()
        with state.lock:
            end_s, sent, waited_s = state.clock.now(), state.transfers[mark[1]:], state.clock.waited_s
        return {"start_s": mark[0], "end_s": end_s, "busy_s": (end_s - mark[0]) - (waited_s - mark[2]),
                "bytes": float(sum(t.nbytes for t in sent)), **inter_region_traffic(sent, region_of)}

    def p2p_since(self, emulation: Emulation | None, mark: StepMark | None) -> list[TransferRecord]:
        """The point-to-point messages this rank sent since `mark` (the emulator's stamps; none without
        emulation: torch's pipelining owns the sends, so there is no call to time)."""
        if emulation is None or mark is None:
            return []
        slot = self.layout.slot(self.rank)
        records = []
        state = emulation.state()
        with state.lock:
            sent = state.transfers[mark[1]:]
        for t in sent:
            if t.op != "send":
                continue
            peer = self.layout.slot(t.dst_rank).stage
            kind, cut = ("fwd", slot.stage) if peer > slot.stage else ("bwd", peer)
            records.append(TransferRecord(kind, cut, slot.replica, t.seq, int(t.nbytes),
                                          t.start_s * self.time_scale, t.end_s * self.time_scale))
        return records

    def collective(self, group: Any, devices: list[int], nbytes: int | Callable[[], int], run: Callable[[], T],
                   posted: bool = False) -> T:
        """Run `run()` (the real collectives of `group`, or of a list of groups) and record its
        communication seconds; `nbytes`: payload bytes per member, or a function that tells them after
        the run (when only the run knows them); `posted`: `run` waits for a collective posted earlier
        (module doc). The one timing path of every DP collective."""
        if len(devices) < 2:
            result = run()
            self.collectives.append(CollectiveRecord(nbytes if isinstance(nbytes, int) else nbytes(), 0.0, 0.0,
                                                     posted))
            return result
        groups = list(group) if isinstance(group, list | tuple) else [group]
        emulated = [g for g in groups if isinstance(g, EmulatedProcessGroup)]
        self.waiting_on = f"the data-parallel group of devices {devices}"
        if emulated:
            marks = [len(g.spans) for g in emulated]
            result = run()
            spans = [span for g, mark in zip(emulated, marks, strict=True) for span in g.spans[mark:]]
            seconds = (max(s[2] for s in spans) - min(s[1] for s in spans)) * self.time_scale if spans else 0.0
        else:
            if len(groups) == 1 and not posted:
                dist.barrier(group=groups[0])
            start = time.time()
            result = run()
            seconds = time.time() - start
        self.waiting_on = None
        self.collectives.append(CollectiveRecord(nbytes if isinstance(nbytes, int) else nbytes(), seconds, seconds,
                                                 posted))
        return result

    def take_records(self) -> list[CollectiveRecord]:
        """The collective records since the last call (one iteration's worth), clearing them."""
        collectives, self.collectives = self.collectives, []
        return collectives
