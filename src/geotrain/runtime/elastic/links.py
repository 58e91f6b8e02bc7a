"""The links between an elastic run's replica groups: the emulating backend around torchft's groups, and
the link state a partition cuts.

Each process of a group emulates its own plan device (`process_device`: the device of its (stage, shard) slot
position in its replica) with `geotrain.emulate.TorchftGroups`: every gloo group its torchft Manager creates
runs over the cluster's emulated links (the outer sync between the same position of every group: the links
between the sites). A group of S x K > 1 processes also emulates the links inside it (`GroupLinks`): its own
gloo groups (the pipeline's stage-to-stage sends, FSDP2's all-gathers and reduce-scatters among a stage's K
shards, tied weights) run on the emulating backend of `geotrain.emulate.install`, group rank r on the device of
position r. One emulated clock per process, shared by both kinds of groups, as a run that is not elastic
has one per rank (a rejoining group's processes take their peer positions' clocks with their state). The
launcher owns the link state: the devices whose links are cut, one JSON list under CUT_KEY in its store;
every emulated operation reads it at issue, so a cut device's collectives (and its peers' with it) raise
`LinkDown` until the launcher heals it (partitions: S x K = 1, rules.py).

With `--time-scale 0` and a partition in `--chaos`, the groups are wrapped all the same (the link state
needs the backend) but the links cost no wall time (the emulated clock sleeps 0 x the link time).

Under `--netlab` (runtime/elastic/lab.py) the links are real: nothing is emulated, each group reaches the
others at its lab address (`GroupNet`), and a cut is its lab interface losing its carrier.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.chaos import has_partition
from geotrain.runtime.elastic.stage import group_size

LOCAL_HOST = "127.0.0.1"
CUT_KEY = "links/cut"
"""Launcher store key: the JSON list of the cluster devices whose links are cut now."""


@dataclass(frozen=True)
class GroupNet:
    """Where a replica group talks: `store_host`, the launcher's bookkeeping store; `advertise`, the address
    its torchft Manager, TCPStore and checkpoint server give their peers; `ifname`, its lab interface,
    whose carrier says whether its links are cut (None: not in a lab; the emulated link state says)."""

    store_host: str = LOCAL_HOST
    advertise: str = LOCAL_HOST
    ifname: str | None = None


def group_device(config: RuntimeConfig, group: int) -> int:
    """The cluster device of replica group `group`'s first process (stage 0, shard 0): the device a partition
    cuts (S x K = 1 only, rules.py)."""
    return int(config.assignment[0, group])


def process_device(config: RuntimeConfig, group: int, rank: int) -> int:
    """The cluster device group rank `rank` (stage x K + shard) of replica group `group` emulates."""
    stage, shard = divmod(rank, config.layout.k)
    return int(config.layout.devices[stage, group, shard])


def emulates_links(config: RuntimeConfig) -> bool:
    """Whether the groups run on the emulating backend: link emulation on, or a partition to inject."""
    chaos = config.reliability.chaos
    if config.reliability.netlab:
        return False  # real shaped links; a partition is a real port down
    return config.emulation.time_scale > 0 or (chaos is not None and has_partition(chaos))


def set_cut(store: Any, devices: Iterable[int]) -> None:
    """Cut the links of `devices` (and heal every other device's)."""
    store.set(CUT_KEY, json.dumps(sorted(int(d) for d in devices)))


def read_cut(store: Any) -> frozenset[int]:
    """The devices whose links are cut now (none before the launcher wrote the state)."""
    if not store.check([CUT_KEY]):
        return frozenset()
    return frozenset(json.loads(store.get(CUT_KEY).decode()))


class GroupLinks:
    """One process's emulated links (enter it before its groups exist): `torchft`, the TorchftGroups of its
    Manager's groups; `inside`, the group's own links (S x K > 1: `geotrain.emulate.install` over the group's
    devices, by group rank; None for a group of one process). `clock` is the process's one emulated clock."""

    def __init__(self, torchft: Any, install_inside: Any = None) -> None:
        self.torchft, self.clock, self.cut_devices = torchft, torchft.clock, torchft.cut_devices
        self._install_inside = install_inside
        self.inside: Any = None

    def __enter__(self) -> GroupLinks:
        if self._install_inside is not None:
            self.inside = self._install_inside()
        self.torchft.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.torchft.__exit__(*exc)

    def _inside_transfers(self) -> list[Any]:
        """What this process sent in the group's own groups (after the group's default group exists)."""
        return [] if self.inside is None else self.inside.state().transfers

    def transfer_mark(self) -> tuple[tuple[int, ...], int]:
        """How many transfers this process has sent so far, in torchft's groups and in the group's own."""
        return self.torchft.transfer_mark(), len(self._inside_transfers())

    def transfers_since(self, mark: tuple[tuple[int, ...], int]) -> list[Any]:
        """The transfers this process sent since `mark`, over every emulated group (the sites' and the group's)."""
        return self.torchft.transfers_since(mark[0]) + self._inside_transfers()[mark[1]:]


def group_links(config: RuntimeConfig, group: int, store: Any, rank: int = 0) -> GroupLinks | None:
    """The GroupLinks of group rank `rank` of replica group `group` (enter it before its process groups and
    Manager exist), or None when the run does not emulate links."""
    if not emulates_links(config):
        return None
    from geotrain.emulate.clock import RankClock
    from geotrain.emulate.install import COMPUTE_CLOCKS, install
    from geotrain.emulate.network import EmulatedNetwork
    from geotrain.emulate.torchft_groups import TorchftGroups

    device, scale = process_device(config, group, rank), config.emulation.time_scale
    factors = config.compute_scale()
    clock = RankClock(scale, wall=COMPUTE_CLOCKS[config.emulation.compute_clock],
                      compute_scale=1.0 if factors is None else factors[device])
    torchft = TorchftGroups(EmulatedNetwork.from_cluster(config.cluster, scale), device, clock=clock,
                            cut_devices=lambda: read_cut(store))
    size = group_size(config)
    if size == 1:
        return GroupLinks(torchft)
    devices = [process_device(config, group, r) for r in range(size)]
    return GroupLinks(torchft, lambda: install(config.cluster, devices, scale,
                                               compute_clock=config.emulation.compute_clock,
                                               compute_scale=factors, clock=clock))
