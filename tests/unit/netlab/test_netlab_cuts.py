"""netlab.cuts: which routes a cut of sites withdraws in which namespace (pure: no root), and how a process sees a
route (the lab runs: tests/integration/netlab/test_netlab_elastic_partition.py and ..._pipeline.py, root)."""

from __future__ import annotations

from geotrain.cluster import load_cluster
from geotrain.netlab.cuts import cut_routes, reaches
from geotrain.netlab.names import LabName
from geotrain.netlab.topology import CONTROL_ADDRESS, lab_topology
from paths import ROOT

CLUSTER = load_cluster(str(ROOT / "tests" / "data" / "wan-2x2.yaml"))


def test_a_cut_site_keeps_its_own_links_and_loses_every_other_route_both_ways():
    topology = lab_topology(CLUSTER, [0, 1, 2, 3], LabName(pid=1, tag="beef"))
    east, west = ("10.77.0.1", "10.77.0.2"), ("10.77.1.1", "10.77.1.2")
    ns = [d.namespace for d in topology.devices]
    routes = cut_routes(topology, [[2, 3]])  # the west site (lab ranks 2, 3) cut off
    assert routes[ns[2]] == routes[ns[3]] == frozenset([*east, CONTROL_ADDRESS])  # not each other
    assert routes[ns[0]] == routes[ns[1]] == routes[topology.lab_namespace] == frozenset(west)
    two = cut_routes(topology, [[1], [2, 3]])  # two sites cut at once: each off from the other too
    assert two[ns[1]] == frozenset([east[0], *west, CONTROL_ADDRESS]) and two[ns[0]] == frozenset([east[1], *west])
    assert two[ns[2]] == frozenset([*east, CONTROL_ADDRESS])
    assert cut_routes(topology, []) == {}  # healed: no route withdrawn anywhere


def test_a_route_lookup_says_an_address_with_a_route_is_reachable():
    assert reaches("127.0.0.1") is True
