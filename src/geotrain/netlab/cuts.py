"""A lab site cut off from the other sites (a partition), and how a process inside it sees the cut.

A site is a set of lab ranks (an elastic run's replica group: its S x K devices). A cut drops, silently, every packet
between the site and any other address of the lab, at the site's own links, both ways:

    device i's interface  (its egress, the htb root of netlab.shaping): packets to any address outside the site (the
                          other devices, the lab's control address: the Lighthouse, the launcher's store) go to class
                          1:3, whose pfifo holds nothing (limit 0), ahead of the shaping filters (CUT_PRIO)
    its bridge port       (the lab namespace's side, egress: what the bridge delivers to device i): an htb root of its
                          own, unshaped but for the same class 1:3 taking packets from any address outside the site

so the links between the site's own devices stay up (a group's pipeline and FSDP2 traffic flows on), as does
everything between the other sites. A heal removes both.

    set_cut(lab.topology, [[2, 3]], cut)    # lab ranks 2 and 3 (one site) cut off from the rest
    set_cut(lab.topology, [], cut)          # healed
    is_cut("gt2")                           # inside rank 2's namespace, while cut: True

A cut is a real partition for TCP, as a cable pulled between the sites: nothing arrives and nothing is refused (no
reset, no "no route"), so every end, the site's own included, learns of it only by its timeouts; established
connections resume after the heal if neither side gave up meanwhile.
"""

from __future__ import annotations

from collections.abc import Collection
from ipaddress import IPv4Address

from pyroute2 import IPRoute

from geotrain.netlab.shaping import DEFAULT_CLASS, ETH_P_IP, ROOT_HANDLE, UNSHAPED_RATE_BPS, add_class
from geotrain.netlab.topology import LabTopology, NetLabError

CUT_CLASS = ROOT_HANDLE | 0x3
"""The htb class a cut sends the packets it drops to (netlab.shaping holds 1:1, 1:2 and 1:<0x100+j>)."""
CUT_LEAF = 0x3000 << 16
CUT_PRIO = 1
"""The cut's filters' priority: before the shaping filters (netlab.shaping.SHAPE_PRIO)."""
DST_OFFSET, SRC_OFFSET = 16, 12  # of the IPv4 header's addresses


def set_cut(topology: LabTopology, sites: Collection[Collection[int]], cut: Collection[int]) -> frozenset[int]:
    """Cut each of `sites` (a set of lab ranks) off from every address of `topology` outside it (other cut sites
    included) and heal the rest; `cut`: the lab ranks cut now (only those whose state changes are touched; a rank cut
    before and still cut keeps its site: heal it first to move it). Returns the lab ranks cut afterwards."""
    site_of = {rank: frozenset(site) for site in sites for rank in site}
    if len(site_of) != sum(len(site) for site in sites):
        raise NetLabError(f"netlab: a lab rank in two cut sites: {[sorted(site) for site in sites]}")
    for rank in sorted(set(cut) - set(site_of)):
        _heal(topology, rank)
    for rank in sorted(set(site_of) - set(cut)):
        outside = [d.address for d in topology.devices if d.rank not in site_of[rank]]
        _cut(topology, rank, [*outside, topology.control_address])
    return frozenset(site_of)


def is_cut(ifname: str) -> bool:
    """Whether interface `ifname` of this thread's network namespace (a lab device's) is cut off from the other
    sites now. NetLabError if there is no such interface here."""
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=ifname)
        if not index:
            raise NetLabError(f"netlab: interface {ifname!r} not found in this namespace")
        return any(c["handle"] == CUT_CLASS for c in ipr.get_classes(index=index[0]))


def _cut(topology: LabTopology, rank: int, outside: list[str]) -> None:
    device = topology.devices[rank]
    with IPRoute(netns=topology.lab_namespace, flags=0) as ipr:  # what reaches the device: unshaped but the cut
        port = ipr.link_lookup(ifname=device.peer_ifname)[0]
        ipr.tc("add", "htb", port, ROOT_HANDLE, default=DEFAULT_CLASS & 0xFFFF)
        add_class(ipr, port, DEFAULT_CLASS, UNSHAPED_RATE_BPS)
        _drop(ipr, port, outside, SRC_OFFSET)
    with IPRoute(netns=device.namespace, flags=0) as ipr:  # what the device sends: into its shaping root
        _drop(ipr, ipr.link_lookup(ifname=device.ifname)[0], outside, DST_OFFSET)


def _drop(ipr: IPRoute, index: int, addresses: list[str], offset: int) -> None:
    """Packets with one of `addresses` at `offset` of their IPv4 header into CUT_CLASS, whose queue holds none."""
    add_class(ipr, index, CUT_CLASS, UNSHAPED_RATE_BPS)
    ipr.tc("add", "pfifo", index, CUT_LEAF, parent=CUT_CLASS, limit=0)
    for address in addresses:
        ipr.tc("add-filter", "u32", index, parent=ROOT_HANDLE, prio=CUT_PRIO, protocol=ETH_P_IP, target=CUT_CLASS,
               keys=[f"0x{int(IPv4Address(address)):08x}/0xffffffff+{offset}"])


def _heal(topology: LabTopology, rank: int) -> None:
    device = topology.devices[rank]
    with IPRoute(netns=topology.lab_namespace, flags=0) as ipr:
        ipr.tc("del", "htb", ipr.link_lookup(ifname=device.peer_ifname)[0], ROOT_HANDLE)
    with IPRoute(netns=device.namespace, flags=0) as ipr:
        index = ipr.link_lookup(ifname=device.ifname)[0]
        ipr.tc("del-filter", "u32", index, parent=ROOT_HANDLE, prio=CUT_PRIO, protocol=ETH_P_IP, target=CUT_CLASS)
        ipr.tc("del-class", "htb", index, CUT_CLASS, parent=ROOT_HANDLE, rate="1000bit")
