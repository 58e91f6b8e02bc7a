"""netlab pieces that need no root: names, the topology it would build, device lists, burst sizes."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.cli.main import main
from geotrain.cluster import cluster_from_dict
from geotrain.cluster.devices import DeviceListError
from geotrain.netlab import NetLabError, lab_topology
from geotrain.netlab.launch import WorkerResult, worst_exit_code
from geotrain.netlab.names import LabName, new_lab_name, parse_namespace
from geotrain.netlab.shaping import (
    FRAME_BYTES,
    GSO_MAX_BYTES,
    WIRE_PER_PAYLOAD,
    burst_bytes,
    needs_segmenter,
    whole_packet_bytes,
)

CLUSTER = cluster_from_dict({
    "name": "three",
    "regions": [{"name": "east", "devices": 3, "intra": {"gbps": 1, "ms": 0.1}},
                {"name": "west", "devices": 2, "intra": {"gbps": 2, "ms": 0.2}},
                {"name": "north", "devices": 1}],
    "links": [{"between": ["east", "west"], "gbps": 0.1, "ms": 20},
              {"between": ["east", "north"], "gbps": 0.2, "ms": 30},
              {"between": ["west", "north"], "gbps": 0.3, "ms": 40}],
})


def test_lab_names_carry_the_owner_pid_and_parse_back():
    lab = new_lab_name(pid=4242)
    name = lab.namespace("d3")
    assert name.startswith("gt4242-") and name.endswith("-d3")
    assert parse_namespace(name) == (lab, "d3")
    assert new_lab_name().pid != 0
    for foreign in ("gt4242-d3", "netns1", "gtx-abcd-lab", "gt12-abcd-lab-extra", "gt12-ABCD-lab"):
        assert parse_namespace(foreign) is None


def test_topology_gives_each_rank_its_devices_rates_and_a_region_address():
    topology = lab_topology(CLUSTER, [4, 0, 5, 1], LabName(pid=7, tag="00ff"))
    assert [d.device for d in topology.devices] == [4, 0, 5, 1]
    assert [d.address for d in topology.devices] == ["10.77.1.1", "10.77.0.1", "10.77.2.1", "10.77.0.2"]
    assert [d.namespace for d in topology.devices] == ["gt7-00ff-d0", "gt7-00ff-d1", "gt7-00ff-d2", "gt7-00ff-d3"]
    assert topology.namespaces[0] == "gt7-00ff-lab"
    assert topology.region_names == {0: "east", 1: "west", 2: "north"}
    expected_gbps = np.array([[0, 0.1, 0.3, 0.1], [0.1, 0, 0.2, 1], [0.3, 0.2, 0, 0.2], [0.1, 1, 0.2, 0]])
    np.testing.assert_allclose(topology.rate_bps, expected_gbps * 1e9)
    assert topology.delay_s[0, 2] == pytest.approx(0.040)


@pytest.mark.parametrize("devices, message", [
    ([], "at least one device"),
    ([0, 6], "must be in 0..5, got 6"),
    ([1, 2, 1], "[2]: device 1 listed twice"),
])
def test_bad_device_lists_are_rejected_with_the_offending_entry(devices, message):
    with pytest.raises(DeviceListError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        lab_topology(CLUSTER, devices, LabName(pid=1, tag="0000"))


def test_netlab_cli_names_bad_devices_and_exits_2(capsys):
    assert main(["netlab", "up", "--cluster", "seed-geo", "--devices", "0,x"]) == 2
    assert "--devices" in capsys.readouterr().err


def test_burst_is_a_millisecond_of_rate_but_at_least_one_frame():
    assert burst_bytes(5.2e6) == FRAME_BYTES  # 650 B of rate: one full frame
    assert burst_bytes(100e6) == 12_500
    assert burst_bytes(10e9) == 1_250_000


def test_packets_longer_than_a_millisecond_of_a_slow_link_are_cut_into_frames():
    assert whole_packet_bytes(5.2e6) == 2 * FRAME_BYTES - 1  # one frame passes whole, two are cut
    assert whole_packet_bytes(100e6) == 12_500
    assert needs_segmenter(5.2e6) and needs_segmenter(65e6)
    assert not needs_segmenter(66e6) and not needs_segmenter(10e9)  # 64 KiB is under 8 ms there


@pytest.mark.parametrize("rate_bps", [1e6, 5e6, 20e6, 100e6, 500e6, 1e9, 10e9])
def test_what_passes_at_line_rate_after_idle_is_a_few_milliseconds(rate_bps):
    # htb lets a packet out while its bucket is not empty: a message after an idle spell gets the
    # bucket plus one packet through at once (the old 64 KiB + 64 KiB: 210 ms early at 5 Mbit/s)
    wire_bps = rate_bps * WIRE_PER_PAYLOAD
    packet = whole_packet_bytes(wire_bps) if needs_segmenter(wire_bps) else GSO_MAX_BYTES
    early_s = 8 * (burst_bytes(wire_bps) + packet) / wire_bps
    assert early_s <= max(1e-3, 8 * 2 * FRAME_BYTES / wire_bps) + max(8e-3 if rate_bps > 65e6 else 1e-3,
                                                                    8 * 2 * FRAME_BYTES / wire_bps) + 1e-12


def test_worst_exit_code_reports_the_first_failure():
    ok, bad, killed, hung = (WorkerResult(0, 0, ""), WorkerResult(1, 3, ""), WorkerResult(2, -9, ""),
                             WorkerResult(3, None, ""))
    assert worst_exit_code([ok, ok]) == 0
    assert worst_exit_code([ok, bad, killed]) == 3
    assert worst_exit_code([killed, bad]) == 137
    assert worst_exit_code([ok, hung]) == 124


@pytest.mark.parametrize("nic, expected", [(None, None), (0.5, [0.5e9] * 3), ([1, 2, 3], [1e9, 2e9, 3e9])])
def test_nic_rates_are_one_for_all_or_one_per_rank(nic, expected):
    topology = lab_topology(CLUSTER, [0, 1, 3], LabName(pid=1, tag="0000"), nic)
    assert (topology.nic_bps is None) if expected is None else topology.nic_bps.tolist() == expected


@pytest.mark.parametrize("nic", [0.0, -1.0, [1.0, 2.0], float("nan")])
def test_bad_nic_rates_are_rejected(nic):
    with pytest.raises(NetLabError, match="--nic-gbps"):
        lab_topology(CLUSTER, [0, 1, 3], LabName(pid=1, tag="0000"), nic)
