"""Cluster files: every defect is a one-line error naming file, key path and problem; YAML/JSON
round trips in both forms; the seeded generator is deterministic."""

import json

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cli.main import main
from geotrain.cluster import (
    ClusterFileError,
    cluster_from_dict,
    cluster_to_dict,
    load_cluster,
    load_cluster_file,
    make_network,
    parse_cluster_text,
    region_cluster,
    save_cluster_file,
    seed_geo,
)

COMPACT = """name: t
regions:
  - {name: a, devices: 2, intra: {gbps: 10, ms: 0.1}}
  - {name: b, devices: 2, intra: {gbps: 10, ms: 0.1}}
  - {name: c, devices: 1}
links:
  - {between: [a, b], gbps: 1, ms: 50}
  - {between: [a, c], gbps: 1, ms: 50}
  - {between: [b, c], gbps: 1, ms: 50}
"""
DENSE = """devices: [{name: x, region: a}, {name: y, region: a}, {name: z, region: b}]
bandwidth_gbps: [[0, 10, 1], [10, 0, 1], [1, 1, 0]]
latency_ms: [[0, 1, 50], [1, 0, 50], [50, 50, 0]]
"""

# (defect, file text, expected "key path: problem" fragment)
DEFECTS = [
    ("negative bandwidth", COMPACT.replace("[a, b], gbps: 1", "[a, b], gbps: -1"), "links[0].gbps: must be > 0, got -1"),
    ("zero bandwidth", COMPACT.replace("[a, c], gbps: 1", "[a, c], gbps: 0"), "links[1].gbps: must be > 0, got 0"),
    ("unknown region in a link", COMPACT.replace("[b, c]", "[b, d]"), "links[2].between[1]: unknown region 'd'"),
    ("missing region pair", COMPACT.replace("  - {between: [b, c], gbps: 1, ms: 50}\n", ""),
     "links: missing link between 'b' and 'c'"),
    ("duplicate region pair", COMPACT + "  - {between: [b, a], gbps: 2, ms: 5}\n", "links[3].between: duplicate link"),
    ("NaN latency", COMPACT.replace("[a, b], gbps: 1, ms: 50", "[a, b], gbps: 1, ms: .nan"),
     "links[0].ms: must be finite, got nan"),
    ("infinite bandwidth", COMPACT.replace("[a, b], gbps: 1", "[a, b], gbps: .inf"), "links[0].gbps: must be finite"),
    ("non-square matrix", DENSE.replace("[1, 1, 0]]\nlat", "[1, 1]]\nlat"),
     "bandwidth_gbps[2]: must have 3 entries (square matrix), got 2"),
    ("missing matrix row", DENSE.replace(", [1, 1, 0]]\nlat", "]\nlat"), "bandwidth_gbps: must have 3 rows"),
    ("asymmetric matrix", DENSE.replace("[[0, 10, 1], [10, 0, 1]", "[[0, 10, 1], [9, 0, 1]"),
     "bandwidth_gbps[0][1]: matrix must be symmetric: 10.0 != bandwidth_gbps[1][0] = 9.0"),
    ("NaN in a dense matrix", DENSE.replace("[50, 50, 0]", "[50, .nan, 0]"), "latency_ms[2][1]: must be finite"),
    ("duplicate region name", COMPACT.replace("name: b,", "name: a,"), "regions[1].name: duplicate region name 'a'"),
    ("zero devices", COMPACT.replace("name: a, devices: 2", "name: a, devices: 0"),
     "regions[0].devices: must be an integer >= 1, got 0"),
    ("misspelt key", COMPACT.replace("[a, b], gbps: 1, ms: 50", "[a, b], gbps: 1, msec: 50"),
     "links[0]: unknown key 'msec'"),
    ("link from a region to itself", COMPACT.replace("[a, b]", "[a, a]"), "links[0].between: links a region to itself"),
    ("not YAML", COMPACT.replace("links:", "links: [[["), "line 7: not valid YAML/JSON"),
    ("bandwidth not a number", COMPACT.replace("[a, b], gbps: 1", "[a, b], gbps: fast"),
     "links[0].gbps: must be a number, got 'fast'"),
    ("negative latency", COMPACT.replace("[a, b], gbps: 1, ms: 50", "[a, b], gbps: 1, ms: -5"),
     "links[0].ms: must be >= 0, got -5"),
    ("missing intra link figures", COMPACT.replace(", intra: {gbps: 10, ms: 0.1}}\n  - {name: b", "}\n  - {name: b"),
     "regions[0].intra.gbps: missing"),
    ("missing dense latency", DENSE.split("latency_ms")[0], "latency_ms: missing"),
    ("duplicate device name", DENSE.replace("name: y", "name: x"), "devices[1].name: duplicate device name 'x'"),
]


@pytest.mark.parametrize("defect,text,expected", DEFECTS, ids=[d[0] for d in DEFECTS])
def test_bad_cluster_file_gives_one_line_error_naming_the_problem(defect, text, expected):
    with pytest.raises(ClusterFileError) as caught:
        parse_cluster_text(text, "bad.yaml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("bad.yaml: ")
    assert expected in message


def test_defects_are_distinct_and_at_least_eight():
    assert len({d[0] for d in DEFECTS}) == len(DEFECTS) >= 8


@pytest.mark.parametrize("defect,text,expected", DEFECTS[:4] + DEFECTS[7:10], ids=[d[0] for d in DEFECTS[:4] + DEFECTS[7:10]])
def test_cli_reports_bad_cluster_file_on_one_line_with_exit_2(defect, text, expected, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["cluster", "show", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and str(path) in lines[0]


def test_unknown_cluster_spec_is_one_line_error(capsys):
    assert main(["cluster", "show", "no-such-preset"]) == 2
    err = capsys.readouterr().err.strip()
    assert "neither a cluster preset" in err and "seed-geo" in err and "\n" not in err


def test_cluster_show_lists_regions_and_links(capsys):
    assert main(["cluster", "show", "seed-geo"]) == 0
    out = capsys.readouterr().out
    cluster = seed_geo()
    for name in cluster.region_names:
        assert name in out
    link = cluster.region_link(0, 3)
    assert f"{link.gbps:.3g}" in out and f"{link.ms:.3g}" in out
    assert main(["cluster", "show", "seed-geo", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert np.array_equal(cluster_from_dict(doc).bandwidth_gbps, cluster.bandwidth_gbps)


positive = st.floats(0.01, 400.0, allow_nan=False, allow_infinity=False)
non_negative = st.floats(0.0, 500.0, allow_nan=False, allow_infinity=False)


@st.composite
def region_clusters(draw):
    n_regions = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 4), min_size=n_regions, max_size=n_regions))
    bandwidth = np.zeros((n_regions, n_regions))
    latency = np.zeros((n_regions, n_regions))
    for a in range(n_regions):
        for b in range(a, n_regions):
            bandwidth[a, b] = bandwidth[b, a] = draw(positive)
            latency[a, b] = latency[b, a] = draw(non_negative)
    gpus = draw(st.lists(st.sampled_from(["V100", "A100", "H100", "T4"]), min_size=n_regions, max_size=n_regions))
    names = [f"r{i}-{draw(st.sampled_from(['us', 'eu', 'asia']))}" for i in range(n_regions)]
    return region_cluster("prop", names, sizes, bandwidth, latency, gpus)


@st.composite
def dense_clusters(draw):
    n = draw(st.integers(2, 6))
    bandwidth = np.zeros((n, n))
    latency = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            bandwidth[i, j] = bandwidth[j, i] = draw(positive)
            latency[i, j] = latency[j, i] = draw(non_negative)
    regions = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    base = region_cluster("dense", ["x", "y", "z"], [1, 1, 1], np.ones((3, 3)), np.zeros((3, 3)))
    names = sorted(set(regions), key=regions.index)
    return type(base)(name="dense", device_names=tuple(f"d{i}" for i in range(n)),
                      region_names=tuple(f"g{g}" for g in names),
                      region_of=np.array([names.index(g) for g in regions]),
                      gpus=tuple("A100" for _ in range(n)), bandwidth_gbps=bandwidth, latency_ms=latency)


def assert_same_cluster(a, b):
    assert a.name == b.name
    assert a.device_names == b.device_names and a.region_names == b.region_names and a.gpus == b.gpus
    assert np.array_equal(a.region_of, b.region_of)
    assert np.array_equal(a.bandwidth_gbps, b.bandwidth_gbps)
    assert np.array_equal(a.latency_ms, b.latency_ms)


@settings(max_examples=40, deadline=None)
@given(cluster=st.one_of(region_clusters(), dense_clusters()), as_json=st.booleans())
def test_cluster_round_trips_through_yaml_and_json(cluster, as_json):
    doc = cluster_to_dict(cluster)
    if "regions" in doc:  # the compact form is chosen only when it loses nothing
        assert cluster.is_region_uniform()
    text = json.dumps(doc) if as_json else yaml.safe_dump(doc, sort_keys=False)
    assert_same_cluster(parse_cluster_text(text, "round.yaml"), cluster)


@settings(max_examples=15, deadline=None)
@given(cluster=region_clusters())
def test_compact_cluster_round_trips_through_dense_form(cluster):
    doc = cluster_to_dict(cluster, form="dense")
    assert "devices" in doc
    assert_same_cluster(cluster_from_dict(yaml.safe_load(yaml.safe_dump(doc)), "x.yaml"), cluster)


def test_exponent_floats_are_numbers_in_yaml_and_json():
    text = COMPACT.replace("[a, b], gbps: 1, ms: 50", "[a, b], gbps: 1e0, ms: 5.0e1").replace("ms: 0.1}", "ms: 1e-1}")
    cluster = parse_cluster_text(text, "exp.yaml")
    assert cluster.region_link(0, 1).gbps == 1.0 and cluster.region_link(0, 1).ms == 50.0
    assert cluster.region_link(0, 0).ms == 0.1
    json_text = json.dumps(cluster_to_dict(cluster)).replace("50.0", "5e1")  # JSON's own exponent style
    assert '"ms": 5e1' in json_text
    assert parse_cluster_text(json_text, "exp.json").region_link(0, 1).ms == 50.0


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_save_and_load_files(tmp_path, suffix):
    path = tmp_path / f"geo{suffix}"
    save_cluster_file(seed_geo(), path)
    assert_same_cluster(load_cluster_file(path), seed_geo())
    assert_same_cluster(load_cluster(str(path)), seed_geo())


def test_make_network_is_deterministic_and_in_range():
    args = ([8, 8, 8, 8], 10.0, (0.3, 1.3), (10.0, 250.0))
    first, second, other = make_network(*args, seed=0), make_network(*args, seed=0), make_network(*args, seed=1)
    assert_same_cluster(first, second)
    assert not np.array_equal(first.bandwidth_gbps, other.bandwidth_gbps)
    inter = first.region_of[:, None] != first.region_of[None, :]
    intra = ~inter & ~np.eye(32, dtype=bool)
    assert np.all((first.bandwidth_gbps[inter] >= 0.3) & (first.bandwidth_gbps[inter] <= 1.3))
    assert np.all((first.latency_ms[inter] >= 10) & (first.latency_ms[inter] <= 250))
    assert np.all(first.bandwidth_gbps[intra] == 10.0) and np.all(first.latency_ms[intra] == 0.1)
    assert first.is_region_uniform()
    # each unordered region pair drawn once: 6 distinct figures for 4 regions
    assert len({first.region_link(a, b).gbps for a in range(4) for b in range(a + 1, 4)}) == 6
