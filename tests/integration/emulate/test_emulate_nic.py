"""The emulating backend takes each device's NIC from the cluster file (`nic_gbps`), unless overridden."""

from paths import ROOT
import json
import os
import textwrap

import numpy as np
import pytest

from geotrain.cluster import parse_cluster_text
from geotrain.emulate import EmulatedNetwork, run_rounds
from geotrain.emulate import algorithms
from geotrain.emulate.launch import LaunchConfig, launch

# 4 devices: 0,1 in region a, 2,3 in region b; a-b 1 Gbit/s 50 ms, inside 10 Gbit/s 1 ms
FOUR = """name: t4
regions:
  - {name: a, devices: 2, intra: {gbps: 10, ms: 1}}
  - {name: b, devices: 2, intra: {gbps: 10, ms: 1}}
links:
  - {between: [a, b], gbps: 1, ms: 50}
"""
# device 1 (ring link 1 -> 2 crosses regions) gets a 0.25 Gbit/s NIC, tighter than the 1 Gbit/s link
TIGHT = """name: t4-nic
devices:
  - {name: a0, region: a}
  - {name: a1, region: a, nic_gbps: 0.25}
  - {name: b0, region: b}
  - {name: b1, region: b}
bandwidth_gbps: [[0, 10, 1, 1], [10, 0, 1, 1], [1, 1, 0, 10], [1, 1, 10, 0]]
latency_ms: [[0, 1, 50, 50], [1, 0, 50, 50], [50, 50, 0, 1], [50, 50, 1, 0]]
"""
SRC = str(ROOT / "src")
CHUNK_BYTES = 0.25e6  # ring all-reduce of 1e6 bytes over 4 ranks: chunks of 1e6 / 4


def ring_step_s(rate_bps: float) -> float:
    """One ring step whose slowest message crosses regions (50 ms) at `rate_bps`."""
    return 0.050 + 8 * CHUNK_BYTES / rate_bps


def test_network_takes_the_nic_of_each_device_from_the_cluster():
    net = EmulatedNetwork.from_cluster(parse_cluster_text(TIGHT, "tight.yaml"))
    assert net.nic_bps[1] == 0.25e9 and np.isinf(net.nic_bps[[0, 2, 3]]).all()
    assert net.rate_bps(1, 2) == 0.25e9 and net.rate_bps(0, 2) == 1e9
    override = EmulatedNetwork.from_cluster(parse_cluster_text(TIGHT, "tight.yaml"), nic_gbps=5.0)
    assert np.all(override.nic_bps == 5e9)  # an explicit --nic-gbps replaces the file's figures


def test_a_tighter_nic_from_the_file_slows_the_ring_allreduce_by_the_expected_amount():
    devices = [0, 1, 2, 3]
    rounds = algorithms.ring_allreduce(4, 1e6)
    _, free = run_rounds(EmulatedNetwork.from_cluster(parse_cluster_text(FOUR, "f.yaml")), devices, devices, rounds, 0.0)
    _, tight = run_rounds(EmulatedNetwork.from_cluster(parse_cluster_text(TIGHT, "t.yaml")), devices, devices, rounds, 0.0)
    assert free == pytest.approx(6 * ring_step_s(1e9))  # 0.312 s
    assert tight == pytest.approx(6 * ring_step_s(0.25e9))  # 0.348 s: device 1's NIC bounds every step
    assert tight - free == pytest.approx(6 * 8 * CHUNK_BYTES * (1 / 0.25e9 - 1 / 1e9))


ALLREDUCE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(250_000)  # 1e6 bytes
dist.all_reduce(t)
assert t[0].item() == dist.get_world_size()
"""


@pytest.mark.slow
def test_emulated_processes_use_the_cluster_files_nic(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = tmp_path / "allreduce.py"
    script.write_text(textwrap.dedent(ALLREDUCE))
    durations = {}
    for label, text in (("free", FOUR), ("tight", TIGHT)):
        report_path = tmp_path / f"{label}.json"
        result = launch(parse_cluster_text(text, f"{label}.yaml"), [0, 1, 2, 3],
                        LaunchConfig((str(script),), time_scale=0.0, report_path=report_path, timeout_s=120))
        assert result.exit_code == 0, result.rank_codes
        op = [o for o in json.loads(report_path.read_text())["ops"] if o["op"] == "allreduce"][0]
        durations[label] = op["end_s"] - op["start_s"]
    assert durations["free"] == pytest.approx(6 * ring_step_s(1e9), rel=1e-9)
    assert durations["tight"] == pytest.approx(6 * ring_step_s(0.25e9), rel=1e-9)
