"""What one emulating process knows: the network, which device each global rank is, its clock, its records."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geotrain.emulate.clock import RankClock
from geotrain.emulate.network import EmulatedNetwork, LinkDown
from geotrain.emulate.schedule import SenderQueues, Transfer


@dataclass(frozen=True)
class OpRecord:
    """One collective of a group as its first member saw it: emulated seconds, payload bytes per member."""

    op: str
    seq: int
    group: str
    ranks: tuple[int, ...]
    nbytes: float
    start_s: float
    end_s: float

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "seq": self.seq, "group": self.group, "ranks": list(self.ranks),
                "nbytes": self.nbytes, "start_s": self.start_s, "end_s": self.end_s}


@dataclass
class EmulationState:
    """Per process: network, global rank -> device, this rank, its clock, its sends and its groups' ops;
    `cut_devices()`: the devices whose links are cut now (a partition: nothing reaches or leaves them)."""

    network: EmulatedNetwork
    devices: tuple[int, ...]
    rank: int
    clock: RankClock
    transfers: list[Transfer] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    cut_devices: Callable[[], frozenset[int]] = frozenset

    def __post_init__(self) -> None:
        self.queues = SenderQueues(self.network, self.devices[self.rank])
        self.p2p_sent = 0

    @property
    def device(self) -> int:
        return self.devices[self.rank]

    def cut_among(self, devices: Sequence[int]) -> list[int]:
        """The cut devices among an operation's member `devices` (none when fewer than two distinct)."""
        return sorted(self.cut_devices().intersection(devices)) if len(set(devices)) > 1 else []

    def check_links(self, devices: Sequence[int], op: str, cut_seen: bool = False) -> None:
        """LinkDown unless every link among `devices` (an operation's members) is up; `cut_seen`: a member
        saw a cut when the operation was issued (raise even if the links have healed since)."""
        down = self.cut_among(devices)
        if down or cut_seen:
            where = f"device(s) {down}" if down else "a member, when it was issued"
            raise LinkDown(f"geotrain.emulate: {op} among devices {list(devices)} not delivered: links cut "
                           f"(partition) at {where}")

    def record(self, transfers: Sequence[Transfer]) -> None:
        """Keep the transfers this rank sends (each transfer is recorded once, by its sender)."""
        self.transfers.extend(t for t in transfers if t.src_rank == self.rank)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "device": self.device, "clock_s": self.clock.now(),
                "slept_s": self.clock.slept_s,
                "compute_scale": self.clock.compute_scale, "transfers": [t.to_json() for t in self.transfers],
                "ops": [o.to_json() for o in self.ops]}

    def write_part(self, directory: Path) -> Path:
        """Write this rank's records as `rank-<r>.json` under `directory`."""
        path = Path(directory) / f"rank-{self.rank}.json"
        path.write_text(json.dumps(self.to_json()))
        return path
