"""Create and destroy a lab's namespaces, bridges, veths, addresses and qdiscs through pyroute2.

`build_lab` appends each namespace to `created` the moment it exists, so that whoever calls it can
always tear down exactly what was built, even when building fails half way. `destroy_namespaces`
deletes the lab's interfaces (and with them their qdiscs), kills whatever still runs inside, and
removes the namespaces, continuing past failures and reporting them at the end.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from geotrain.netlab.names import NETNS_DIR
from geotrain.netlab.processes import kill_namespace_processes
from geotrain.netlab.shaping import PeerShape, netem_available, shape_egress
from geotrain.netlab.topology import (
    CORE_BRIDGE,
    PREFIX_LEN,
    LabTopology,
    NetLabError,
    bridge_name,
    uplink_names,
)


def check_can_build() -> None:
    """NetLabError unless this process may create network namespaces (root, /proc/self/ns/net)."""
    if os.geteuid() != 0:
        raise NetLabError("netlab: needs root (network namespaces, veths and qdiscs); run as root")
    if not os.path.exists("/proc/self/ns/net"):
        raise NetLabError("netlab: this kernel has no network namespaces (/proc/self/ns/net missing)")


def build_lab(topology: LabTopology, created: list[str]) -> bool:
    """Build `topology`; returns whether latency is shaped (netem present). Appends every namespace
    to `created` as soon as it may exist."""
    for name in topology.namespaces:
        if os.path.exists(os.path.join(NETNS_DIR, name)):
            raise FileExistsError(errno.EEXIST, "netlab: namespace exists already (not this lab's)", name)
        # Recorded before it exists: a signal can interrupt the creation (in a pyroute2 helper)
        # after the namespace is made; tearing down a namespace that was never made is a no-op.
        created.append(name)
        netns.create(name)
    with IPRoute(netns=topology.lab_namespace, flags=0) as lab:
        _up(lab, "lo")
        with_delay = netem_available(lab)
        for region in topology.regions:
            _add_bridge(lab, bridge_name(region))
        lab.addr("add", index=lab.link_lookup(ifname=bridge_name(topology.regions[0]))[0],
                 address=topology.control_address, prefixlen=PREFIX_LEN)
        if len(topology.regions) > 1:
            _add_bridge(lab, CORE_BRIDGE)
            for region in topology.regions:
                near, far = uplink_names(region)
                lab.link("add", ifname=near, kind="veth", peer={"ifname": far})
                _attach(lab, near, bridge_name(region))
                _attach(lab, far, CORE_BRIDGE)
        for device in topology.devices:
            lab.link("add", ifname=device.peer_ifname, kind="veth",
                     peer={"ifname": device.ifname, "net_ns_fd": device.namespace})
            _attach(lab, device.peer_ifname, bridge_name(device.region))
    for device in topology.devices:
        peers = [PeerShape(other.address, float(topology.rate_bps[device.rank, other.rank]),
                           float(topology.delay_s[device.rank, other.rank]))
                 for other in topology.devices if other.rank != device.rank]
        with IPRoute(netns=device.namespace, flags=0) as ipr:
            _up(ipr, "lo")
            index = ipr.link_lookup(ifname=device.ifname)[0]
            ipr.addr("add", index=index, address=device.address, prefixlen=PREFIX_LEN)
            ipr.link("set", index=index, state="up")
            nic = None if topology.nic_bps is None else float(topology.nic_bps[device.rank])
            shape_egress(ipr, index, peers, with_delay, nic)
    return with_delay


def destroy_namespaces(names: Iterable[str]) -> list[str]:
    """Tear down the given lab namespaces (interfaces first, then processes, then the namespace);
    returns one line per failure (empty: all gone)."""
    problems = []
    for name in names:
        if not os.path.exists(os.path.join(NETNS_DIR, name)):
            continue
        try:
            _delete_links(name)
        except (OSError, NetlinkError) as exc:
            problems.append(f"{name}: deleting interfaces: {exc}")
        try:
            kill_namespace_processes(name)
            netns.remove(name)
        except OSError as exc:
            problems.append(f"{name}: removing the namespace: {exc}")
    return problems


def _delete_links(name: str) -> None:
    """Delete every interface but lo (a veth's peer and all qdiscs go with it)."""
    with IPRoute(netns=name, flags=0) as ipr:
        for link in ipr.get_links():
            if link.get_attr("IFLA_IFNAME") == "lo":
                continue
            try:
                ipr.link("del", index=link["index"])
            except NetlinkError as exc:
                if exc.code != errno.ENODEV:  # already gone with its veth peer
                    raise


def _up(ipr: IPRoute, ifname: str) -> None:
    ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], state="up")


def _add_bridge(ipr: IPRoute, ifname: str) -> None:
    ipr.link("add", ifname=ifname, kind="bridge", br_stp_state=0, br_forward_delay=0)
    _up(ipr, ifname)


def _attach(ipr: IPRoute, ifname: str, bridge: str) -> None:
    ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0],
             master=ipr.link_lookup(ifname=bridge)[0], state="up")
