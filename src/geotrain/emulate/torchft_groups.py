"""torchft under the emulating backend: every process group torchft creates costs what the links say.

torchft's reconfigurable groups (`torchft.process_group.ProcessGroupGloo`, behind its Manager) build a
fresh gloo group at every quorum, in `_create_pg(store, rank, world_size)`, over torchft's own store
and never through `init_process_group`, so `install()` (and `geotrain emulate`) never sees them.
`TorchftGroups(network, device)` replaces that method on torchft's class, in this process, while it is
entered. The replacement
1. builds the real gloo group torchft would build (over the store torchft hands it);
2. learns which cluster device every member of the quorum emulates: each member posts its own device
   under the quorum's store prefix and reads the others' (quorum ranks are torchft's, not global ranks);
3. returns an `EmulatedProcessGroup` around it: torchft's wrapper calls `parent.allreduce(...)` and
   friends, which now run gloo and advance this process's emulated clock by the links' time.

Every group of the process shares one emulated clock (`clock`; the default group's when `install()`
ran first, so both kinds of traffic are on one timeline). What was sent is kept per group
(`states`: transfers with devices and bytes), across reconfigurations. Not emulated: torchft's quorum
and commit RPCs to the Lighthouse and the replicas' managers, and its checkpoint transfers for
recovery (HTTP on localhost): they cost only the compute clock's time.
torchft is imported lazily (the `geotrain[ft]` extra).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from geotrain.emulate.clock import RankClock
from geotrain.emulate.network import EmulatedNetwork, EmulationError
from geotrain.emulate.process_group import EmulatedProcessGroup
from geotrain.emulate.schedule import Transfer
from geotrain.emulate.state import EmulationState

DEVICE_KEY = "geotrain-emulate/device/"
"""Store key prefix under which each quorum member posts the cluster device it emulates."""


class _Released:
    """What a TorchftEmulatedGroup holds once aborted or shut down: any use is an error."""

    def __getattr__(self, name: str) -> Any:
        raise EmulationError(f"TorchftEmulatedGroup: {name} on a group torchft aborted or shut down (a new "
                             f"quorum's group replaces it)")


class TorchftEmulatedGroup(EmulatedProcessGroup):
    """An emulated group torchft can reconfigure: `abort` / `shutdown` reach the real gloo group and release it.

    Released, because gloo's abort leaves the group's connections open: torchft drops its group there and plain
    gloo closes them when it is freed, which is how a member still blocked in a collective with this process (its
    ring neighbour alive, the dead member elsewhere) learns at once that the collective failed. Held on (the
    TorchftGroups keeps this group for its records), that member waited out its --comm-timeout (120 s by default;
    4 groups, one SIGKILLed: 20.0 s at a 20 s timeout held, 0.08 s released)."""

    def abort(self) -> None:
        self._release("abort")

    def shutdown(self) -> None:
        self._release("shutdown")

    def _release(self, how: str) -> None:
        inner, self._inner = self._inner, _Released()
        self._pending.clear()  # their works hold the gloo context too
        if not isinstance(inner, _Released):
            getattr(inner, how, lambda: None)()


class TorchftGroups:
    """While entered, every torchft gloo group this process creates is emulated (module doc).
    `device`: the cluster device this process emulates; `clock`: the process's emulated clock (None:
    a new one with `time_scale` and `wall`, restarted at 0 when the first group is created);
    `cut_devices()`: the devices whose links are cut now (a partition; their groups' operations raise LinkDown)."""

    def __init__(self, network: EmulatedNetwork, device: int, clock: RankClock | None = None,
                 time_scale: float = 1.0, wall: Any = time.perf_counter,
                 cut_devices: Callable[[], frozenset[int]] = frozenset) -> None:
        if not 0 <= device < network.n_devices:
            raise EmulationError(f"TorchftGroups: device must be in 0..{network.n_devices - 1} (the cluster's "
                                 f"devices), got {device!r}")
        self.network = network
        self.device = int(device)
        self.cut_devices = cut_devices
        self._own_clock = clock is None
        self.clock = clock if clock is not None else RankClock(time_scale, wall=wall)
        self.states: list[EmulationState] = []
        self.groups: list[TorchftEmulatedGroup] = []
        self._original: Any = None

    def __enter__(self) -> TorchftGroups:
        from torchft.process_group import ProcessGroupGloo

        if self._original is not None:
            raise EmulationError("TorchftGroups: already entered")
        self._original = ProcessGroupGloo.__dict__["_create_pg"]
        emulation = self

        def _create_pg(pg_self: Any, store: Any, rank: int, world_size: int) -> Any:
            return emulation.create(store, rank, world_size, pg_self._timeout)

        ProcessGroupGloo._create_pg = _create_pg
        return self

    def __exit__(self, *exc: object) -> None:
        from torchft.process_group import ProcessGroupGloo

        if self._original is not None:
            ProcessGroupGloo._create_pg = self._original
            self._original = None

    def create(self, store: Any, rank: int, world_size: int, timeout: timedelta) -> TorchftEmulatedGroup:
        """The emulated group over `store` for quorum rank `rank` of `world_size` (what `_create_pg` returns)."""
        store.set(f"{DEVICE_KEY}{rank}", str(self.device))
        devices = tuple(int(store.get(f"{DEVICE_KEY}{r}")) for r in range(world_size))
        inner = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        if self._own_clock and not self.states:
            self.clock.restart(0.0)  # the first quorum's members meet here: a common emulated 0
        state = EmulationState(self.network, devices, rank, self.clock, cut_devices=self.cut_devices)
        group = TorchftEmulatedGroup(inner, rank, world_size, list(range(world_size)), state)
        self.states.append(state)
        self.groups.append(group)
        return group

    def transfer_mark(self) -> tuple[int, ...]:
        """How many transfers each group has recorded so far (for `transfers_since`)."""
        return tuple(len(state.transfers) for state in self.states)

    def transfers_since(self, mark: tuple[int, ...]) -> list[Transfer]:
        """The transfers this process sent in every group since `mark` (groups created since: all of theirs)."""
        return [t for i, state in enumerate(self.states) for t in state.transfers[(mark[i] if i < len(mark) else 0):]]

    def bytes_sent(self, region_of: Any = None) -> float:
        """Payload bytes this process sent over emulated links in every group so far; with `region_of`
        (device -> region) only those between regions."""
        return float(sum(t.nbytes for state in self.states for t in state.transfers
                         if region_of is None or region_of[t.src_device] != region_of[t.dst_device]))
