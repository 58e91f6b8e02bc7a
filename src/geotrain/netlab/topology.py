"""What a lab will build for a cluster and a list of devices: pure data, no kernel calls.

Layout (all inside namespaces the lab creates; nothing is added to the machine's own namespace):

    lab namespace  <prefix>-lab:  one bridge per region `br-r<g>`; with several regions, a core
                                  bridge `br-core` and one uplink veth pair per region
                                  (`up-r<g>` on the region bridge, `up-r<g>c` on the core), a tree,
                                  so no layer-2 loop whatever the number of regions
    device namespace <prefix>-d<i> (lab device i = rank i): interface `gt<i>` with address
                                  10.77.<g>.<k+1>/16 (g: the device's cluster region, k: its position
                                  among the lab's devices of that region); its peer `gt<i>p` sits on
                                  the region bridge
    control address               10.77.255.254/16 on the first region bridge (lab namespace): what
                                  runs in the lab namespace itself (an elastic run's Lighthouse and
                                  bookkeeping store) is reachable from every device there, unshaped,
                                  and unreachable from a device whose port is down (a partition)

Shaping is per ordered device pair, at the sender: device i's interface has one htb class per peer j
at the cluster's bandwidth b(i, j) (a u32 filter on j's address selects it), with a netem delay of
the cluster's latency a(i, j) under it where the kernel has netem. That is what a cluster file
describes (one bandwidth and one latency per device pair), so the lab, the cost models and the
emulator all read the same numbers the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cluster.devices import check_device_list
from geotrain.errors import GeotrainError
from geotrain.netlab.names import LabName

SUBNET_OCTETS = (10, 77)
PREFIX_LEN = 16
MAX_RATE_BPS = 32e9  # htb's 32-bit ceil field stops here; a veth carries far less anyway
LAB_ROLE = "lab"
CONTROL_ADDRESS = f"{SUBNET_OCTETS[0]}.{SUBNET_OCTETS[1]}.255.254"


class NetLabError(GeotrainError, RuntimeError):
    """A lab cannot be built or used (bad device list, not root, kernel lacks a feature)."""


@dataclass(frozen=True)
class LabDevice:
    """One lab device (= one rank): its cluster device, namespace, interface and address."""

    rank: int
    device: int
    name: str
    region: int
    namespace: str
    ifname: str
    peer_ifname: str
    address: str


@dataclass(frozen=True, eq=False)
class LabTopology:
    """Everything a lab builds; `rate_bps[i, j]` and `delay_s[i, j]` shape traffic from rank i to j;
    `nic_bps[i]` caps all of rank i's outgoing traffic together (None: no NIC limit)."""

    lab: LabName
    cluster_name: str
    devices: tuple[LabDevice, ...]
    region_names: dict[int, str]
    rate_bps: np.ndarray
    delay_s: np.ndarray
    nic_bps: np.ndarray | None = None

    @property
    def lab_namespace(self) -> str:
        return self.lab.namespace(LAB_ROLE)

    @property
    def control_address(self) -> str:
        """The lab namespace's own address (CONTROL_ADDRESS), reachable from every device."""
        return CONTROL_ADDRESS

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace of the lab, the lab namespace first."""
        return (self.lab_namespace, *(d.namespace for d in self.devices))

    @property
    def regions(self) -> tuple[int, ...]:
        """Cluster region indices present in the lab, ascending."""
        return tuple(sorted(self.region_names))


def bridge_name(region: int) -> str:
    return f"br-r{region}"


def uplink_names(region: int) -> tuple[str, str]:
    """(end on the region bridge, end on the core bridge)."""
    return f"up-r{region}", f"up-r{region}c"


CORE_BRIDGE = "br-core"


def lab_topology(cluster: Cluster, devices: list[int], lab: LabName,
                 nic_gbps: float | list[float] | None = None) -> LabTopology:
    """The lab for `devices` (rank i = cluster device devices[i]) of `cluster`; `nic_gbps`: one NIC
    rate for every rank, or one per rank, or None (unlimited)."""
    devices = check_device_list(devices, cluster.n_devices)
    position: dict[int, int] = {}
    lab_devices = []
    for rank, device in enumerate(devices):
        region = int(cluster.region_of[device])
        if region > 255:
            raise NetLabError(f"--devices[{rank}]: region index {region} of device {device} exceeds 255")
        k = position.get(region, 0)
        position[region] = k + 1
        if k + 1 > (253 if region == 255 else 254):  # 10.77.255.254 is the lab's control address
            raise NetLabError(f"--devices: more than {253 if region == 255 else 254} devices of region "
                              f"{cluster.region_names[region]!r}")
        lab_devices.append(LabDevice(
            rank=rank, device=device, name=cluster.device_names[device], region=region,
            namespace=lab.namespace(f"d{rank}"), ifname=f"gt{rank}", peer_ifname=f"gt{rank}p",
            address=f"{SUBNET_OCTETS[0]}.{SUBNET_OCTETS[1]}.{region}.{k + 1}"))
    index = np.array(devices)
    rate = np.minimum(cluster.bandwidth_bps[np.ix_(index, index)], MAX_RATE_BPS)
    return LabTopology(lab=lab, cluster_name=cluster.name, devices=tuple(lab_devices),
                       region_names={g: cluster.region_names[g] for g in sorted(position)},
                       rate_bps=rate, delay_s=cluster.latency_s[np.ix_(index, index)],
                       nic_bps=_nic_rates(nic_gbps, len(devices)))


def _nic_rates(nic_gbps: float | list[float] | None, n: int) -> np.ndarray | None:
    if nic_gbps is None:
        return None
    rates = np.full(n, float(nic_gbps)) if np.ndim(nic_gbps) == 0 else np.asarray(nic_gbps, dtype=float)
    if rates.shape != (n,) or not np.all(np.isfinite(rates)) or rates.min() <= 0:
        raise NetLabError(f"--nic-gbps: need one positive rate or one per device ({n}), got {nic_gbps!r}"[:200])
    return np.minimum(rates * 1e9, MAX_RATE_BPS)
