"""Where devices run, in cluster files: `host`, `gpu_index` and `nic_gbps` per device (dense form) or
per region (compact form); strict one-line errors; lossless round trips through the writer."""

import json
import math

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import Cluster, ClusterError, ClusterFileError, cluster_from_dict, cluster_to_dict, parse_cluster_text

COMPACT = """name: t
regions:
  - {name: a, devices: 2, host: alpha, nic_gbps: 2.5, intra: {gbps: 10, ms: 0.1}}
  - {name: b, devices: 2, intra: {gbps: 10, ms: 0.1}}
links:
  - {between: [a, b], gbps: 1, ms: 50}
defaults: {nic_gbps: 40}
"""
DENSE = """name: d
devices:
  - {name: x, region: a, host: alpha, gpu_index: 0, nic_gbps: 1.5}
  - {name: y, region: a, host: alpha, gpu_index: 1}
  - {name: z, region: b, host: beta}
bandwidth_gbps: [[0, 10, 1], [10, 0, 1], [1, 1, 0]]
latency_ms: [[0, 1, 50], [1, 0, 50], [50, 50, 0]]
"""


def test_compact_regions_give_host_and_nic_to_each_of_their_devices():
    cluster = parse_cluster_text(COMPACT, "c.yaml")
    assert cluster.hosts == ("alpha", "alpha", None, None)
    assert cluster.gpu_index == (None,) * 4
    assert cluster.nic_gbps.tolist() == [2.5, 2.5, 40.0, 40.0]  # region b takes defaults.nic_gbps
    assert cluster.has_hosts


def test_dense_devices_name_host_gpu_index_and_nic():
    cluster = parse_cluster_text(DENSE, "d.yaml")
    assert cluster.hosts == ("alpha", "alpha", "beta")
    assert cluster.gpu_index == (0, 1, None)
    assert cluster.nic_gbps[0] == 1.5 and np.isinf(cluster.nic_gbps[1:]).all()


def test_absent_fields_mean_one_machine_and_unlimited_nics():
    cluster = parse_cluster_text(COMPACT.replace(", host: alpha, nic_gbps: 2.5", "").replace(
        "defaults: {nic_gbps: 40}\n", ""), "plain.yaml")
    assert not cluster.has_hosts and cluster.hosts == (None,) * 4
    assert np.isinf(cluster.nic_gbps).all()
    assert "host" not in json.dumps(cluster_to_dict(cluster)) and "nic" not in json.dumps(cluster_to_dict(cluster))


DEFECTS = [
    ("host not a string", DENSE.replace("host: beta", "host: 7"), "d.yaml: devices[2].host: must be a non-empty string, got 7"),
    ("empty host", COMPACT.replace("host: alpha", "host: ''"), "c.yaml: regions[0].host: must be a non-empty string, got ''"),
    ("negative GPU index", DENSE.replace("gpu_index: 1", "gpu_index: -1"),
     "d.yaml: devices[1].gpu_index: must be an integer in 0..4095, got -1"),
    ("GPU index as text", DENSE.replace("gpu_index: 1", "gpu_index: one"),
     "d.yaml: devices[1].gpu_index: must be an integer in 0..4095, got 'one'"),
    ("GPU index boolean", DENSE.replace("gpu_index: 1", "gpu_index: true"),
     "d.yaml: devices[1].gpu_index: must be an integer in 0..4095, got True"),
    ("GPU used twice on a host", DENSE.replace("gpu_index: 1", "gpu_index: 0"),
     "d.yaml: devices[1].gpu_index: GPU 0 of host 'alpha' is already device 'x'"),
    ("zero NIC", DENSE.replace("nic_gbps: 1.5", "nic_gbps: 0"), "d.yaml: devices[0].nic_gbps: must be > 0, got 0"),
    ("infinite NIC", COMPACT.replace("nic_gbps: 2.5", "nic_gbps: .inf"), "c.yaml: regions[0].nic_gbps: must be finite"),
    ("NIC not a number", COMPACT.replace("nic_gbps: 40", "nic_gbps: fast"),
     "c.yaml: defaults.nic_gbps: must be a number, got 'fast'"),
    ("GPU index in a region", COMPACT.replace("host: alpha", "gpu_index: 0"), "c.yaml: regions[0]: unknown key 'gpu_index'"),
    ("misspelt nic key", DENSE.replace("nic_gbps: 1.5", "nic_gpbs: 1.5"), "d.yaml: devices[0]: unknown key 'nic_gpbs'"),
]


@pytest.mark.parametrize("defect,text,expected", DEFECTS, ids=[d[0] for d in DEFECTS])
def test_bad_placement_is_a_one_line_error_naming_file_key_and_value(defect, text, expected):
    source = "d.yaml" if text.startswith("name: d") else "c.yaml"
    with pytest.raises(ClusterFileError) as caught:
        parse_cluster_text(text, source)
    message = str(caught.value)
    assert expected in message and "\n" not in message


def test_cluster_checks_placement_built_in_python():
    base = parse_cluster_text(DENSE, "d.yaml")
    fields = dict(name="p", device_names=base.device_names, region_names=base.region_names, region_of=base.region_of,
                  gpus=base.gpus, bandwidth_gbps=base.bandwidth_gbps, latency_ms=base.latency_ms)
    with pytest.raises(ClusterError, match="one entry per device"):
        Cluster(**fields, hosts=("a", "b"))
    with pytest.raises(ClusterError, match="two devices on host 'a' use GPU 3"):
        Cluster(**fields, hosts=("a", "a", None), gpu_index=(3, 3, 3))
    with pytest.raises(ClusterError, match="nic_gbps must be in"):
        Cluster(**fields, nic_gbps=[1.0, -2.0, 1.0])
    assert Cluster(**fields, nic_gbps=[1.0, math.inf, 3.0]).nic_gbps.tolist() == [1.0, math.inf, 3.0]


hosts = st.one_of(st.none(), st.sampled_from(["alpha", "beta", "gpu-box-7", "10.0.0.2"]))
nics = st.one_of(st.just(math.inf), st.floats(0.001, 1000.0, allow_nan=False, allow_infinity=False))


@st.composite
def placed_clusters(draw):
    """Clusters of 1..4 regions with hosts, GPU indices and NICs drawn per device or per region."""
    n_regions = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 3), min_size=n_regions, max_size=n_regions))
    region_of = np.repeat(np.arange(n_regions), sizes)
    n = len(region_of)
    bandwidth = np.full((n_regions, n_regions), draw(st.floats(0.01, 400.0)))
    latency = np.full((n_regions, n_regions), draw(st.floats(0.0, 500.0)))
    if draw(st.booleans()):  # per region: the compact form can hold it
        host_of, nic_of = draw(st.lists(hosts, min_size=n_regions, max_size=n_regions)), draw(
            st.lists(nics, min_size=n_regions, max_size=n_regions))
        device_hosts = [host_of[r] for r in region_of]
        device_nics = [nic_of[r] for r in region_of]
        gpu_index = [None] * n
    else:
        device_hosts = draw(st.lists(hosts, min_size=n, max_size=n))
        device_nics = draw(st.lists(nics, min_size=n, max_size=n))
        gpu_index = [d if draw(st.booleans()) else None for d in range(n)]  # distinct where given
    names = [f"r{g}" for g in range(n_regions)]
    return Cluster(name="placed", device_names=tuple(f"{names[r]}-{k}" for r, size in enumerate(sizes) for k in range(size)),
                   region_names=tuple(names), region_of=region_of, gpus=("A100",) * n,
                   bandwidth_gbps=bandwidth[np.ix_(region_of, region_of)], latency_ms=latency[np.ix_(region_of, region_of)],
                   hosts=tuple(device_hosts), gpu_index=tuple(gpu_index), nic_gbps=device_nics)


def assert_same_placement(a: Cluster, b: Cluster) -> None:
    assert a.device_names == b.device_names and a.hosts == b.hosts and a.gpu_index == b.gpu_index
    assert np.array_equal(a.nic_gbps, b.nic_gbps)
    assert np.array_equal(a.bandwidth_gbps, b.bandwidth_gbps) and np.array_equal(a.latency_ms, b.latency_ms)


@settings(max_examples=60, deadline=None)
@given(cluster=placed_clusters(), as_json=st.booleans(), form=st.sampled_from(["auto", "dense"]))
def test_hosts_gpu_indices_and_nics_round_trip_through_the_writer(cluster, as_json, form):
    doc = cluster_to_dict(cluster, form)
    if "regions" in doc:  # chosen only when lossless: no GPU index, hosts and NICs uniform per region
        assert all(g is None for g in cluster.gpu_index)
    text = json.dumps(doc) if as_json else yaml.safe_dump(doc, sort_keys=False)
    assert_same_placement(parse_cluster_text(text, "round.yaml"), cluster)


@settings(max_examples=60, deadline=None)
@given(host=st.one_of(st.integers(), st.floats(), st.text(max_size=3), st.none(), st.booleans()),
       gpu=st.one_of(st.integers(-5, 5000), st.floats(), st.text(max_size=2), st.booleans()),
       nic=st.one_of(st.integers(-3, 3), st.floats(), st.text(max_size=2)))
def test_any_placement_value_loads_sanely_or_fails_on_one_line(host, gpu, nic):
    doc = {"devices": [{"name": "x", "host": host, "gpu_index": gpu, "nic_gbps": nic}, {"name": "y"}],
           "bandwidth_gbps": [[0, 1], [1, 0]], "latency_ms": [[0, 1], [1, 0]]}
    try:
        cluster = cluster_from_dict(doc, "f.json")
    except ClusterFileError as exc:
        assert str(exc).startswith("f.json: devices[0].") and "\n" not in str(exc)
        return
    assert cluster.hosts[0] == host and cluster.gpu_index[0] == gpu and cluster.nic_gbps[0] == nic
    assert_same_placement(cluster_from_dict(cluster_to_dict(cluster), "again"), cluster)
