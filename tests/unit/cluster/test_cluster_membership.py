"""cluster.membership: naming live devices (names or indices), restricting a cluster, lifting a plan back."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import make_network
from geotrain.cluster.devices import DeviceListError
from geotrain.cluster.membership import Membership, device_index, read_membership_file, restrict_cluster

# 3 regions of 2 devices (names region0-0 ... region2-1), links differing by pair
CLUSTER = make_network([2, 2, 2], 10.0, (0.05, 1.0), (10.0, 80.0), seed=3, name="three")


def test_devices_are_named_by_name_or_index_and_anything_else_is_one_line_naming_the_range():
    assert device_index(CLUSTER, "region1-1", "x") == 3
    assert device_index(CLUSTER, 5, "x") == device_index(CLUSTER, " 5", "x") == 5
    for bad in ("region9-0", "6", -1, True, 2.0):
        with pytest.raises(DeviceListError, match=r"^--exclude-devices: unknown device .*: cluster 'three' has "
                                                  r"devices 0\.\.5 named region0-0, region0-1, region1-0, region1-1, \.\.\.$"):
            device_index(CLUSTER, bad, "--exclude-devices")


def test_excluding_every_device_or_listing_none_or_twice_is_refused():
    with pytest.raises(DeviceListError, match="excludes all 6 devices of cluster 'three'; at least one must stay live"):
        Membership.excluding(CLUSTER, [str(d) for d in range(6)], "--exclude-devices")
    with pytest.raises(DeviceListError, match="m.json: lists no live device"):
        Membership.listing(CLUSTER, [], "m.json")
    with pytest.raises(DeviceListError, match="m.json: device 'region0-1' is listed twice"):
        Membership.listing(CLUSTER, ["region0-1", 1], "m.json")
    with pytest.raises(DeviceListError, match=r"m.json\[1\]: unknown device 'mars'"):
        Membership.listing(CLUSTER, [0, "mars"], "m.json")


def test_a_membership_file_is_a_json_or_yaml_list(tmp_path):
    (tmp_path / "m.yaml").write_text("- region0-0\n- 4\n")
    assert Membership.listing(CLUSTER, read_membership_file(tmp_path / "m.yaml"), "m.yaml").live == (0, 4)
    (tmp_path / "m.json").write_text('{"live": [0]}')
    with pytest.raises(DeviceListError, match="m.json: a membership file is a list of live devices .*, got dict"):
        read_membership_file(tmp_path / "m.json")


@settings(max_examples=40, deadline=None)
@given(st.sets(st.integers(0, 5), max_size=5))
def test_the_live_cluster_keeps_each_live_devices_links_and_lift_maps_back(excluded):
    membership = Membership.excluding(CLUSTER, sorted(excluded), "--exclude-devices")
    live = np.array(membership.live)
    assert sorted(set(membership.live) | excluded) == list(range(6)) and not set(membership.live) & excluded
    sub = membership.live_cluster()
    assert sub.device_names == tuple(CLUSTER.device_names[d] for d in live)
    np.testing.assert_array_equal(sub.bandwidth_gbps, CLUSTER.bandwidth_gbps[np.ix_(live, live)])
    np.testing.assert_array_equal(sub.latency_ms, CLUSTER.latency_ms[np.ix_(live, live)])
    assert [sub.region_names[g] for g in sub.region_of] == [CLUSTER.region_names[CLUSTER.region_of[d]] for d in live]
    np.testing.assert_array_equal(membership.lift(np.arange(len(live))[:, None]), live[:, None])
    assert membership.to_json()["excluded_devices"] == sorted(excluded)


def test_restricting_keeps_hosts_gpu_indices_and_nics():
    placed = make_network([2, 2], 10.0, (1.0, 1.0), (5.0, 5.0), seed=0, name="placed")
    placed = replace(placed, hosts=("a", "a", "b", "b"), gpu_index=(0, 1, 0, 1), nic_gbps=np.array([1.0, 2.0, 3.0, 4.0]))
    sub = restrict_cluster(placed, [1, 2])
    assert sub.hosts == ("a", "b") and sub.gpu_index == (1, 0) and sub.nic_gbps.tolist() == [2.0, 3.0]
