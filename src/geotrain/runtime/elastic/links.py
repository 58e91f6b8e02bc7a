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
`LinkDown` until the launcher heals it. A partition cuts every device of a group at once (`group_devices`): the
group's own links (pipeline, FSDP2) stay up, its links to the other groups go down.

With `--time-scale 0` and a partition in `--chaos`, the groups are wrapped all the same (the link state
needs the backend) but the links cost no wall time (the emulated clock sleeps 0 x the link time).

Under `--netlab` (runtime/elastic/hosts.py) the links are real: nothing is emulated, each process of a group in its
own device's namespace reaches the others at its lab address (`GroupNet`; the group's own traffic on its site's
links, the outer sync on the links between the sites), and a cut drops every packet between its group's devices and
the rest of the lab (netlab.cuts), the group's own links left up.

Elastic asynchronous groups (`--outer-sync async*`, runtime/elastic/async_group.py) use no torchft group: their TCP
requests and replies take their emulated link time through `SocketPacing` instead (the links between the client's
device and its server's host's device), slept by the client, and a partition holds them through `CutHold` (the same
link state, read_cut): a message whose either end is cut waits, at its client, for the heal.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.emulate.network import EmulatedNetwork
from geotrain.emulate.schedule import SenderQueues
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.chaos import has_partition
from geotrain.runtime.elastic.stage import group_size
from geotrain.sync.async_socket import ServerSilent
from geotrain.sync.async_wire import HEADER_BYTES, flat_bytes

LOCAL_HOST = "127.0.0.1"
CUT_KEY = "links/cut"
"""Launcher store key: the JSON list of the cluster devices whose links are cut now."""
CUT_POLL_S = 0.05
"""How often a message held by a partition looks at the link state (seconds)."""


@dataclass(frozen=True)
class GroupNet:
    """Where a replica group's process talks: `store_host`, the launcher's bookkeeping store; `advertise`, the
    address its torchft Manager, TCPStore and checkpoint server give their peers; `ifname`, its lab interface (None:
    not in a lab, where the emulated link state says whether its links are cut; in a lab its cut state does:
    netlab.cuts.is_cut); `group_host`, the address of its group rank 0, which hosts the group's own store (its `advertise`)."""

    store_host: str = LOCAL_HOST
    advertise: str = LOCAL_HOST
    ifname: str | None = None
    group_host: str = LOCAL_HOST


def group_device(config: RuntimeConfig, group: int) -> int:
    """The cluster device of replica group `group`'s first process (stage 0, shard 0): its lab namespace's."""
    return int(config.assignment[0, group])


def group_devices(config: RuntimeConfig, group: int) -> list[int]:
    """The cluster devices of replica group `group`'s S x K processes, by group rank: the devices a partition of
    the group cuts, all at once."""
    return [process_device(config, group, rank) for rank in range(group_size(config))]


def process_device(config: RuntimeConfig, group: int, rank: int) -> int:
    """The cluster device group rank `rank` (stage x K + shard) of replica group `group` emulates."""
    stage, shard = divmod(rank, config.layout.k)
    return int(config.layout.devices[stage, group, shard])


def emulates_links(config: RuntimeConfig) -> bool:
    """Whether the groups run on the emulating backend: link emulation on, or a partition to inject."""
    chaos = config.reliability.chaos
    if config.reliability.netlab:
        return False  # real shaped links; a partition is a real cut (netlab.cuts)
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
    devices = group_devices(config, group)
    return GroupLinks(torchft, lambda: install(config.cluster, devices, scale,
                                               compute_clock=config.emulation.compute_clock,
                                               compute_scale=factors, clock=clock))


def message_bytes(tensor: torch.Tensor | None) -> int:
    """Payload bytes of an asynchronous request or reply carrying `tensor` (None: none), counted as the non-elastic
    run's wire counts them (geotrain.sync.async_wire: a header of HEADER_BYTES, then the flat tensor)."""
    return HEADER_BYTES + (0 if tensor is None else flat_bytes(tensor))


class SocketPacing:
    """The emulated links of one process's TCP messages in an elastic asynchronous run (runtime/elastic/async_group.py)
    on cluster `device` of `network` (its time scale) with regions `region_of`. A message of b bytes between devices d
    and e takes what it takes alone on its link: `message_s` = latency(d, e) + 8 b / min(bandwidth(d, e), nic(d)) (the
    emulator's point-to-point time, emulate.schedule.SenderQueues, from an idle queue: a client has one request out);
    `carry` sleeps it x the time scale in wall time and counts it (0 between one device's ends). The client sleeps
    both of its exchange's messages, the request before it leaves (so it reaches the server when it would arrive) and
    the reply once it came (a server thread never sleeps: one slow link does not hold the replies to the others);
    queueing on the host's NIC across clients is not emulated. `take` hands over what was carried since the last
    take (thread-safe: a region server's requests upstream leave from its server's threads)."""

    def __init__(self, network: EmulatedNetwork, region_of: Any, device: int,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.network, self.region_of, self.device, self._sleep = network, region_of, int(device), sleep
        self._lock = threading.Lock()
        self._carried = {"sent_bytes": 0.0, "inter_region_bytes": 0.0, "link_s": 0.0}

    def message_s(self, src: int, dst: int, nbytes: float) -> float:
        """Emulated seconds (latency included) of `nbytes` from device `src` to `dst` alone on its link."""
        return SenderQueues(self.network, src).send(dst, float(nbytes), 0.0)[2]

    def carry(self, src: int, dst: int, tensor: torch.Tensor | None) -> float:
        """Sleep one message carrying `tensor` from device `src` to `dst` out (x the time scale) and count it; its
        emulated seconds."""
        if src == dst:
            return 0.0
        nbytes = message_bytes(tensor)
        seconds = self.message_s(src, dst, nbytes)
        with self._lock:
            self._carried["sent_bytes"] += nbytes
            self._carried["link_s"] += seconds
            if self.region_of[src] != self.region_of[dst]:
                self._carried["inter_region_bytes"] += nbytes
        self._sleep(seconds * self.network.time_scale)
        return seconds

    def take(self) -> dict[str, float]:
        """The bytes (`sent_bytes`, `inter_region_bytes`) and emulated seconds (`link_s`) of the messages carried
        since the last take."""
        with self._lock:
            carried, self._carried = self._carried, dict.fromkeys(self._carried, 0.0)
        return carried


def socket_pacing(config: RuntimeConfig, group: int, rank: int = 0) -> SocketPacing | None:
    """The SocketPacing of group rank `rank` of replica group `group` in an elastic asynchronous run, or None without
    link emulation (--time-scale 0)."""
    if not config.emulation.time_scale > 0:
        return None
    network = EmulatedNetwork.from_cluster(config.cluster, config.emulation.time_scale)
    return SocketPacing(network, config.cluster.region_of, process_device(config, group, rank))


def install_group_links(config: RuntimeConfig, group: int) -> Any:
    """The emulating backend for the own groups (pipeline, FSDP2, where its positions agree) of replica group `group`
    of an elastic asynchronous run of S x K > 1 processes at --time-scale F > 0: group rank r on its device's links
    (geotrain.emulate.install; call it before the group's default group exists), each transfer slept F x its emulated
    time, as the TCP messages are (SocketPacing). No compute scale: --emulate-gpu-speed sleeps the compute out itself
    (runtime/slowdown.py). None for a group of one process or at --time-scale 0."""
    size = group_size(config)
    if size == 1 or not config.emulation.time_scale > 0:
        return None
    from geotrain.emulate.install import install

    return install(config.cluster, [process_device(config, group, r) for r in range(size)],
                   config.emulation.time_scale, compute_clock=config.emulation.compute_clock)


class CutHold:
    """A partition's hold on one process's TCP messages in an elastic asynchronous run (runtime/elastic/elected.py): a
    message between cluster devices `src` and `dst` whose either end the launcher has cut (read_cut) does not pass
    while the cut lasts, as TCP retransmits: `hold` waits for the heal in wall time (not x the time scale: a
    partition's length is the launcher's wall time), polling every `poll_s`, at most `timeout_s` (--comm-timeout; then
    ServerSilent, as from a host that gives no reply), and counts the wait. Nothing waits between one device's ends (a
    host's own client). `take` hands over the seconds waited since the last take (`cut_wait_s`; thread-safe: a region
    server's requests upstream leave from its server's threads)."""

    def __init__(self, timeout_s: float, poll_s: float = CUT_POLL_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.timeout_s, self.poll_s, self._clock, self._sleep = timeout_s, poll_s, clock, sleep
        self._lock = threading.Lock()
        self._waited_s = 0.0

    def hold(self, store: Any, src: int, dst: int) -> float:
        """Wait while `src` or `dst` is cut in `store`'s link state; the wall seconds waited. ServerSilent past
        `timeout_s`."""
        if src == dst or not read_cut(store) & {src, dst}:
            return 0.0
        started = self._clock()
        try:
            while cut := read_cut(store) & {src, dst}:
                if self._clock() - started > self.timeout_s:
                    raise ServerSilent(f"the links of device {min(cut)} stayed cut (a partition) for more than "
                                       f"--comm-timeout {self.timeout_s:g} s")
                self._sleep(self.poll_s)
        finally:
            waited = self._clock() - started
            with self._lock:
                self._waited_s += waited
        return waited

    def take(self) -> dict[str, float]:
        """The wall seconds (`cut_wait_s`) messages waited for a heal since the last take."""
        with self._lock:
            waited, self._waited_s = self._waited_s, 0.0
        return {"cut_wait_s": waited}


def cut_hold(config: RuntimeConfig) -> CutHold | None:
    """The CutHold of an elastic asynchronous run's process, or None without a partition in --chaos."""
    chaos = config.reliability.chaos
    if chaos is None or not has_partition(chaos):
        return None
    return CutHold(config.reliability.comm_timeout_s)
