"""One device-list check for emulate and netlab (geotrain.cluster.devices)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from geotrain.cluster.devices import DeviceListError, check_device_list
from geotrain.cluster import load_cluster
from geotrain.emulate import install
from geotrain.netlab import lab_topology
from geotrain.netlab.names import LabName


@given(st.lists(st.integers(min_value=-3, max_value=10), max_size=8))
def test_a_list_is_accepted_exactly_when_in_range_unique_and_non_empty(devices):
    ok = bool(devices) and len(set(devices)) == len(devices) and all(0 <= d < 8 for d in devices)
    if ok:
        assert check_device_list(devices, 8) == devices
    else:
        with pytest.raises(DeviceListError, match=r"^--devices"):
            check_device_list(devices, 8)


def test_numpy_ints_become_plain_ints_and_bools_are_refused():
    out = check_device_list(np.array([2, 0]), 4)
    assert out == [2, 0] and all(type(d) is int for d in out)
    with pytest.raises(DeviceListError, match=r"\[1\]: device index must be in 0\.\.3, got True"):
        check_device_list([0, True], 4)


@pytest.mark.parametrize("devices, message", [([], "needs at least one device"), ([0, 40], r"\[1\]: device index"),
                                              ([3, 3], r"\[1\]: device 3 listed twice")])
def test_emulate_and_netlab_refuse_the_same_lists_with_the_same_error(devices, message):
    cluster = load_cluster("seed-geo")
    with pytest.raises(DeviceListError, match=message):
        install(cluster, devices)
    with pytest.raises(DeviceListError, match=message):
        lab_topology(cluster, devices, LabName(pid=1, tag="0000"))
