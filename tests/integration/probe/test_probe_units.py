"""Probe pieces that need no network: round scheduling, region clustering, the cluster file it writes."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cli.main import main
from geotrain.cluster import load_cluster_file, parse_cluster_text
from geotrain.probe import (
    Measurements,
    ProbeConfig,
    circle_rounds,
    cluster_document,
    cluster_yaml,
    device_names,
    measure_all,
    partner_in_round,
    probe_record,
    regions_from_measurements,
)


@given(st.integers(min_value=0, max_value=41))
def test_circle_rounds_meet_every_pair_once_and_use_no_device_twice_in_a_round(n):
    rounds = circle_rounds(n)
    pairs = [pair for round_ in rounds for pair in round_]
    assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    for round_ in rounds:
        used = [d for pair in round_ for d in pair]
        assert len(used) == len(set(used))
    assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)
    for round_ in rounds:
        for a, b in round_:
            assert partner_in_round(round_, a) == (b, True)
            assert partner_in_round(round_, b) == (a, False)


def _geo(sizes, intra, inter, noise, seed):
    """Symmetric matrices of a region cluster with multiplicative noise; returns (truth, matrix)."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(len(sizes)), sizes)
    n = len(truth)
    matrix = np.where(truth[:, None] == truth[None, :], intra, inter[truth[:, None], truth[None, :]])
    matrix = matrix * rng.uniform(1 - noise, 1 + noise, size=(n, n))
    matrix = np.triu(matrix, 1) + np.triu(matrix, 1).T
    return truth, matrix


def _same_partition(labels, truth):
    labels = np.asarray(labels)
    return np.array_equal(labels[:, None] == labels[None, :], truth[:, None] == truth[None, :])


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=2, max_size=5), seed=st.integers(0, 2**31 - 1))
def test_regions_are_recovered_from_latency_when_sites_are_milliseconds_apart(sizes, seed):
    rng = np.random.default_rng(seed)
    g = len(sizes)
    inter = rng.uniform(5.0, 250.0, size=(g, g))
    inter = np.triu(inter, 1) + np.triu(inter, 1).T
    truth, latency = _geo(sizes, rng.uniform(0.05, 0.5), inter, 0.2, seed)
    flat_bandwidth = np.full_like(latency, 1.0)
    split = regions_from_measurements(latency, flat_bandwidth)
    assert split.metric == "latency"
    assert _same_partition(split.labels, truth)
    assert split.labels[0] == 0


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(2, 5), min_size=2, max_size=5), seed=st.integers(0, 2**31 - 1))
def test_regions_fall_back_to_bandwidth_when_latency_is_within_noise(sizes, seed):
    rng = np.random.default_rng(seed)
    g = len(sizes)
    inter = rng.uniform(0.1, 0.4, size=(g, g))
    inter = np.triu(inter, 1) + np.triu(inter, 1).T
    truth, bandwidth = _geo(sizes, 1.0, inter, 0.1, seed)
    _, latency = _geo(sizes, 0.08, np.full((g, g), 0.3), 0.5, seed + 1)  # all below the 1 ms floor
    split = regions_from_measurements(latency, bandwidth)
    assert split.metric == "bandwidth"
    assert _same_partition(split.labels, truth)


def test_unevenly_spaced_sites_are_all_separated_at_the_lowest_significant_gap():
    inter = np.array([[0, 3.0, 300.0], [3.0, 0, 300.0], [300.0, 300.0, 0]])
    truth, latency = _geo([2, 2, 2], 0.1, inter, 0.1, 7)
    split = regions_from_measurements(latency, np.ones_like(latency))
    assert split.labels == (0, 0, 1, 1, 2, 2)
    assert split.cut < 3.0


def test_a_uniform_network_is_one_region():
    _, latency = _geo([6], 0.2, np.zeros((1, 1)), 0.5, 0)
    _, bandwidth = _geo([6], 10.0, np.zeros((1, 1)), 0.1, 1)
    split = regions_from_measurements(latency, bandwidth)
    assert (split.metric, split.n_regions) == ("none", 1)


def test_two_devices_split_only_on_latency_above_the_noise_floor():
    far, near = np.array([[0, 80.0], [80.0, 0]]), np.array([[0, 0.3], [0.3, 0]])
    slow = np.array([[0, 0.1], [0.1, 0]])
    assert regions_from_measurements(far, slow).labels == (0, 1)
    assert regions_from_measurements(near, slow).labels == (0, 0)


def _measurements(n=4):
    truth, bandwidth = _geo([2, 2], 0.95, np.full((2, 2), 0.095), 0.02, 3)
    directed = bandwidth * np.random.default_rng(4).uniform(0.98, 1.02, size=(n, n))
    np.fill_diagonal(directed, 0)
    _, latency = _geo([2, 2], 0.07, np.full((2, 2), 0.1), 0.3, 5)
    return Measurements(latency_ms=latency, latency_min_ms=latency * 0.8, rtt_ms_spread=latency / 10,
                        bandwidth_gbps_directed=directed,
                        transfer_bytes=np.full((n, n), 6_250_000) * (1 - np.eye(n, dtype=np.int64)),
                        hosts=("vm",) * n), truth


def test_probe_file_loads_with_the_cluster_loader_and_plan_accepts_it(tmp_path, capsys):
    measured, truth = _measurements()
    split = regions_from_measurements(measured.latency_ms, measured.bandwidth_gbps)
    names = device_names(measured.hosts, (0, 0, 0, 0))
    assert names == ["vm-r0", "vm-r1", "vm-r2", "vm-r3"]
    date = datetime(2026, 12, 2, 23, 40, tzinfo=timezone.utc)
    doc = cluster_document(measured, split, names, ["unknown"] * 4, "probe-test")
    path = tmp_path / "probed.yaml"
    path.write_text(cluster_yaml(doc, probe_record(measured, split, ProbeConfig(), date)))
    cluster = load_cluster_file(path)
    assert cluster.device_names == tuple(names)
    assert _same_partition(cluster.region_of, truth)
    np.testing.assert_allclose(cluster.bandwidth_gbps, measured.bandwidth_gbps, rtol=1e-3)
    np.testing.assert_allclose(cluster.latency_ms, measured.latency_ms, rtol=1e-3)
    text = path.read_text()
    assert "# measured by `geotrain probe` on 2026-12-02T23:40:00+00:00" in text
    raw = json.loads(text.split("#   bandwidth_gbps_directed: ")[1].split("\n")[0])
    np.testing.assert_allclose(raw, measured.bandwidth_gbps_directed, rtol=1e-3)
    assert main(["plan", "--cluster", str(path), "--stages", "2", "--replicas", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert sorted(np.ravel(plan["assignment"]).tolist()) == [0, 1, 2, 3]


def test_device_names_use_local_rank_when_hosts_differ():
    assert device_names(("a", "a", "b"), (0, 1, 0)) == ["a-0", "a-1", "b-0"]


def test_probe_refuses_to_start_outside_torchrun(monkeypatch, capsys):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert main(["probe"]) == 2
    assert "RANK is unset" in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_any_measurement_round_trips_through_the_written_file(n, seed):
    rng = np.random.default_rng(seed)
    directed = rng.uniform(1e-3, 40.0, size=(n, n)) * (1 - np.eye(n))
    rtt = rng.uniform(0.0, 300.0, size=(n, n))
    rtt = (np.triu(rtt, 1) + np.triu(rtt, 1).T) / 2
    measured = Measurements(latency_ms=rtt, latency_min_ms=rtt * 0.9, rtt_ms_spread=rtt / 5,
                            bandwidth_gbps_directed=directed, transfer_bytes=np.full((n, n), 10**7),
                            hosts=tuple(f"h{i % 2}" for i in range(n)))
    split = regions_from_measurements(measured.latency_min_ms, measured.bandwidth_gbps)
    names = device_names(measured.hosts, tuple(range(n)))
    doc = cluster_document(measured, split, names, ["unknown"] * n, "probe")
    text = cluster_yaml(doc, probe_record(measured, split, ProbeConfig(), datetime.now(timezone.utc)))
    cluster = parse_cluster_text(text)
    assert cluster.n_devices == n and cluster.n_regions == split.n_regions
    np.testing.assert_allclose(cluster.bandwidth_gbps, measured.bandwidth_gbps, rtol=1e-3)
    np.testing.assert_allclose(cluster.latency_ms, measured.latency_ms, rtol=1e-3, atol=1e-9)
    raw = json.loads(text.split("#   bandwidth_gbps_directed: ")[1].split("\n")[0])
    np.testing.assert_allclose(raw, directed, rtol=1e-3)


def _measure_worker(rank, world_size):
    return measure_all(ProbeConfig(pings=3, n_bytes=1_000_000, repeats=1, min_seconds=0.01))


@pytest.mark.slow  # ~9 s: three torch processes; the one probe measurement test that needs no root
def test_measure_all_over_loopback_gives_every_rank_the_same_full_matrices():
    from geotrain.comm import run_workers

    results = run_workers(_measure_worker, world_size=3, timeout_s=120)  # odd: one rank sits out each round
    first = results[0]
    off = ~np.eye(3, dtype=bool)
    for other in results[1:]:
        np.testing.assert_array_equal(other.bandwidth_gbps_directed, first.bandwidth_gbps_directed)
        np.testing.assert_array_equal(other.latency_ms, first.latency_ms)
    assert np.all(first.bandwidth_gbps_directed[off] > 0) and np.all(np.diag(first.bandwidth_gbps_directed) == 0)
    assert np.array_equal(first.latency_ms, first.latency_ms.T) and np.all(first.latency_ms[off] > 0)
    assert np.all(first.latency_min_ms[off] <= first.latency_ms[off])
    assert np.all(first.transfer_bytes[off] >= 1_000_000) and np.all(first.transfer_bytes[off] <= 4_000_000)
    assert len(first.hosts) == 3
