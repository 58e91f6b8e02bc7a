"""The links between an elastic run's replica groups: the emulating backend around torchft's groups, and
the link state a partition cuts.

A group emulates its plan device (stage 0 of its replica) with `geotrain.emulate.TorchftGroups`: every gloo
group its torchft Manager creates runs over the cluster's emulated links, on one emulated clock per group
(a rejoining group takes its peer's clock with its state). The launcher owns the link state: the devices
whose links are cut, one JSON list under CUT_KEY in its store; every emulated operation reads it at issue,
so a cut device's collectives (and its peers' with it) raise `LinkDown` until the launcher heals it.

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
    """The cluster device replica group `group` emulates (its stage-0 device; links are emulated for S = 1
    only, rules.py)."""
    return int(config.assignment[0, group])


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


def group_links(config: RuntimeConfig, group: int, store: Any) -> Any:
    """The TorchftGroups for replica group `group` (enter it before the Manager exists), or None when
    the run does not emulate links."""
    if not emulates_links(config):
        return None
    from geotrain.emulate.clock import RankClock
    from geotrain.emulate.install import COMPUTE_CLOCKS
    from geotrain.emulate.network import EmulatedNetwork
    from geotrain.emulate.torchft_groups import TorchftGroups

    device, scale = group_device(config, group), config.emulation.time_scale
    factors = config.compute_scale()
    clock = RankClock(scale, wall=COMPUTE_CLOCKS[config.emulation.compute_clock],
                      compute_scale=1.0 if factors is None else factors[device])
    return TorchftGroups(EmulatedNetwork.from_cluster(config.cluster, scale), device, clock=clock,
                         cut_devices=lambda: read_cut(store))
