"""A lab site cut off from the other sites (a partition), and how a process inside it sees the cut.

A site is a set of lab ranks (an elastic run's replica group: its S x K devices). A cut withdraws the routes between
the site and every other address of the lab: each of the site's device namespaces gets an `unreachable` route to
every other device and to the lab's control address (the Lighthouse, the launcher's store), and every other
namespace, the lab namespace included, one to each of the site's addresses. The links between the site's own
devices stay up (a group's pipeline and FSDP2 traffic flows on), as does everything between the other sites.

    set_cut(lab.topology, [[2, 3]], routes)    # lab ranks 2 and 3 (one site) cut off from the rest
    set_cut(lab.topology, [], routes)          # healed
    reaches(lab.control_address)               # inside rank 2's namespace, while cut: False

A cut is silent on the wire: nothing of the site reaches the others and nothing of theirs reaches it (each packet
dies at its sender's route), so a peer learns of it only by its timeouts; a sender's own new connections fail at once
("No route to host"), its established ones retransmit and resume after the heal if neither side gave up meanwhile.
"""

from __future__ import annotations

import socket
from collections.abc import Collection, Mapping

from pyroute2 import IPRoute

from geotrain.netlab.topology import LabTopology

Routes = dict[str, frozenset[str]]
"""Per namespace, the addresses it has no route to now (its cut routes)."""


def cut_routes(topology: LabTopology, sites: Collection[Collection[int]]) -> Routes:
    """Per namespace of `topology`, the addresses a cut of `sites` (each a set of lab ranks, cut off from every
    address outside it, other cut sites included) leaves it no route to; a namespace with none is left out."""
    address = {d.rank: d.address for d in topology.devices}
    everyone = frozenset([topology.control_address, *address.values()])
    site_of = {rank: frozenset(address[r] for r in site) for site in sites for rank in site}
    islands = frozenset(a for site in site_of.values() for a in site)
    routes = {topology.lab_namespace: islands}
    for device in topology.devices:
        own = site_of.get(device.rank)
        routes[device.namespace] = everyone - own if own is not None else islands
    return {namespace: cut for namespace, cut in routes.items() if cut}


def set_cut(topology: LabTopology, sites: Collection[Collection[int]], routes: Mapping[str, frozenset[str]]) -> Routes:
    """Cut `sites` (cut_routes) and heal every other link of `topology`, changing only the routes that differ from
    `routes` (the cut routes in place now); returns the cut routes in place afterwards."""
    wanted = cut_routes(topology, sites)
    for namespace in topology.namespaces:
        now, then = routes.get(namespace, frozenset()), wanted.get(namespace, frozenset())
        if now == then:
            continue
        with IPRoute(netns=namespace, flags=0) as ipr:
            for dst in sorted(now - then):
                ipr.route("del", dst=dst, dst_len=32, type="unreachable")
            for dst in sorted(then - now):
                ipr.route("add", dst=dst, dst_len=32, type="unreachable")
    return wanted


def reaches(address: str) -> bool:
    """Whether this thread's network namespace has a route to `address` (False while a cut withdrew it). A route
    lookup only (a UDP socket's connect): no packet is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((address, 9))
        except OSError:
            return False
    return True
