"""geotrain.comm.gather: the gather algorithms' seconds equal the emulator's round model, the rule picks
the direct all-to-all on latency-bound links and the ring on ties, and the WAN recipe prices the same."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.cluster import cluster_from_dict, load_cluster_file
from geotrain.bench.wan_rows import WAN_CLUSTER
from geotrain.comm.gather import GatherLinks
from geotrain.cost.wan_recipe import fragment_sync_seconds
from geotrain.emulate import algorithms
from geotrain.emulate.network import EmulatedNetwork
from geotrain.emulate.schedule import run_rounds
from geotrain.job import Job

WAN = load_cluster_file(WAN_CLUSTER)


def _emulated(network: EmulatedNetwork, devices: list[int], algorithm: str, payload: float) -> float:
    n = len(devices)
    rounds = (algorithms.ring_allgather(n, payload) if algorithm == "ring"
              else algorithms.all_to_all([[payload] * n for _ in range(n)]))
    return run_rounds(network, devices, devices, rounds, 0.0)[1]


@pytest.mark.parametrize("nic_gbps", [None, 0.15])
@pytest.mark.parametrize("payload", [0.0, 1e3, 4.2e5, 3.3e6])
def test_seconds_equal_the_emulators_rounds_for_both_algorithms(payload, nic_gbps):
    network = EmulatedNetwork.from_cluster(WAN, nic_gbps=nic_gbps)
    links = GatherLinks.of(network.latency_s, network.bandwidth_bps, network.nic_bps, [2, 0, 3, 1])
    for algorithm in ("ring", "direct"):
        assert links.seconds(algorithm, payload) == pytest.approx(
            _emulated(network, [2, 0, 3, 1], algorithm, payload), rel=1e-12, abs=1e-12)


def test_latency_bound_wan_takes_the_direct_round_by_numbers():
    links = GatherLinks.of_cluster(WAN, [0, 1, 2, 3])
    # ring 0-1-2-3-0: slowest hop frankfurt-tokyo 120 ms; 3 rounds. direct: virginia-tokyo 150 ms, once
    p = 420_000.0
    assert links.seconds("ring", p) == pytest.approx(3 * (0.120 + 8 * p / 1e8))
    assert links.seconds("direct", p) == pytest.approx(0.150 + 8 * p / 1e8)
    assert links.algorithm(p) == "direct"
    assert links.best_seconds(p) == pytest.approx(0.1836)


def test_ties_and_nic_bound_links_keep_the_ring():
    two = GatherLinks.of_cluster(WAN, [0, 3])  # 2 members: one round either way
    assert two.seconds("ring", 1e6) == two.seconds("direct", 1e6) and two.algorithm(1e6) == "ring"
    flat = np.zeros((3, 3))
    nic_bound = GatherLinks.of(flat, np.full((3, 3), 1e9), np.full(3, 1e8), [0, 1, 2])  # no latency, NIC limits
    assert nic_bound.seconds("ring", 1e6) == pytest.approx(nic_bound.seconds("direct", 1e6)) == pytest.approx(0.16)
    assert nic_bound.algorithm(1e6) == "ring"
    assert GatherLinks.of_cluster(WAN, [1]).best_seconds(1e6) == 0.0
    with pytest.raises(ValueError, match="ring, direct"):
        two.seconds("tree", 1.0)


def test_the_recipe_prices_a_gathered_fragment_as_the_chosen_algorithm():
    job = Job(name="m", params=1e6, seq_len=64, hidden=128, global_batch=8, layers=4, bytes_per_value=4, vocab=256)
    payload = 1e6 / 4 * (0.5 + 4 / 128)  # a quarter of the model in int4-block (0.5 + 4/128 bytes per value)
    assert fragment_sync_seconds(WAN, job, np.array([[0, 1, 2, 3]]), 4, "int4-block") == pytest.approx(
        0.150 + 8 * payload / 1e8)
    # two stages: the slowest DP group's (oregon+virginia 60 ms, frankfurt+tokyo 120 ms)
    assert fragment_sync_seconds(WAN, job, np.array([[0, 1], [2, 3]]), 1, "int8-block") == pytest.approx(
        0.120 + 8 * 1e6 / 2 * (1 + 4 / 256) / 1e8)
    two = cluster_from_dict({"name": "two", "regions": [{"name": "a", "devices": 1}, {"name": "b", "devices": 1}],
                             "links": [{"between": ["a", "b"], "gbps": 0.1, "ms": 50}]})
    # summable codecs stay yuan's all-reduce
    assert fragment_sync_seconds(two, job, np.array([[0, 1]]), 1, "none") == pytest.approx(
        2 * (0.05 + 8 * 4e6 / (2 * 1e8)))
