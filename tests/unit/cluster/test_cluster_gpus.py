"""GPU types in cluster files: a compact region lists one type per device; every name is checked against
the table when the file loads (one line: file, key path, the name, the known names); the fingerprint a
plan records changes with what placement depends on and not with names."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import ClusterFileError, cluster_to_dict, load_cluster_file, parse_cluster_text, save_cluster_file
from geotrain.cluster.gpus import GPU_PEAK_TFLOPS, gpu_type_of

MIXED = """name: mixed
regions:
  - {name: east, devices: 4, gpu: [A100, A100, T4, T4]}
  - {name: west, devices: 2, gpu: L4}
links:
  - {between: [east, west], gbps: 1, ms: 20}
defaults: {intra: {gbps: 10, ms: 0.1}}
"""
KNOWN = "known: A10, A100, A100-80GB, A10G, A40, H100, H200, L4, L40S, MI250X, P100, RTX3090, RTX4090, T4, V100, " \
        "V100-32GB (or unknown)"


def test_a_compact_region_lists_one_gpu_type_per_device_and_round_trips(tmp_path):
    cluster = parse_cluster_text(MIXED, "m.yaml")
    assert cluster.gpus == ("A100", "A100", "T4", "T4", "L4", "L4")
    regions = cluster_to_dict(cluster)["regions"]  # still the compact form
    assert [r["gpu"] for r in regions] == [["A100", "A100", "T4", "T4"], "L4"]
    save_cluster_file(cluster, tmp_path / "again.yaml")
    again = load_cluster_file(tmp_path / "again.yaml")
    assert again.gpus == cluster.gpus and again.fingerprint() == cluster.fingerprint()


@pytest.mark.parametrize("old, new, message", [
    ("T4, T4]", "T4]", "m.yaml: regions[0].gpu: must list one GPU type per device: 4 (the region's devices), got 3"),
    ("T4, T4]", "T4, T4, T4]", "m.yaml: regions[0].gpu: must list one GPU type per device: 4 (the region's devices), "
                               "got 5"),
    ("gpu: L4", "gpu: H1000", f"m.yaml: regions[1].gpu: unknown GPU type 'H1000' ({KNOWN})"),
    ("T4, T4]", "T4, X9]", f"m.yaml: regions[0].gpu[3]: unknown GPU type 'X9' ({KNOWN})"),
    ("ms: 0.1}}", "ms: 0.1}, gpu: Z80}", f"m.yaml: defaults.gpu: unknown GPU type 'Z80' ({KNOWN})"),
    ("T4, T4]", "T4, 4]", "m.yaml: regions[0].gpu[3]: must be a non-empty string, got 4"),
])
def test_a_bad_gpu_entry_is_one_line_naming_file_key_path_and_name(old, new, message):
    with pytest.raises(ClusterFileError) as caught:
        parse_cluster_text(MIXED.replace(old, new), "m.yaml")
    assert str(caught.value) == message


def test_a_dense_device_with_an_unknown_gpu_is_refused_and_names_keep_their_table_spelling():
    dense = ("devices: [{name: x, gpu: rtx-4090}, {name: y, gpu: B200X}]\n"
             "bandwidth_gbps: [[0, 1], [1, 0]]\nlatency_ms: [[0, 1], [1, 0]]\n")
    with pytest.raises(ClusterFileError, match=r"^d.yaml: devices\[1\].gpu: unknown GPU type 'B200X' \(known: "):
        parse_cluster_text(dense, "d.yaml")
    assert parse_cluster_text(dense.replace("B200X", "unknown"), "d.yaml").gpus == ("rtx-4090", "unknown")


def test_a_cuda_device_name_maps_to_its_table_type():
    assert [gpu_type_of(n) for n in ("NVIDIA H100 80GB HBM3", "Tesla T4", "NVIDIA L40S", "NVIDIA L4",
                                     "NVIDIA GeForce RTX 4090", "Intel(R) Arc(TM) A770")] == [
        "H100", "T4", "L40S", "L4", "RTX4090", "unknown"]


def test_the_fingerprint_follows_what_placement_depends_on_not_names():
    cluster = parse_cluster_text(MIXED, "m.yaml")
    renamed = parse_cluster_text(MIXED.replace("east", "oregon").replace("name: mixed", "name: other"), "r.yaml")
    assert renamed.fingerprint() == cluster.fingerprint()
    changed = [MIXED.replace("gbps: 1,", "gbps: 2,"), MIXED.replace("ms: 20", "ms: 21"),
               MIXED.replace("A100, A100, T4, T4", "A100, T4, A100, T4"), MIXED.replace("devices: 2", "devices: 3")]
    assert len({parse_cluster_text(text, "c.yaml").fingerprint() for text in changed} | {cluster.fingerprint()}) == 5
    nic = dataclasses.replace(cluster, nic_gbps=np.full(cluster.n_devices, 25.0))
    assert nic.fingerprint() != cluster.fingerprint() and len(cluster.fingerprint()) == 16


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from(sorted(GPU_PEAK_TFLOPS) + ["unknown"]), min_size=1, max_size=4),
                min_size=1, max_size=3))
def test_any_per_device_gpu_list_round_trips_through_the_compact_form(per_region):
    regions = "\n".join(f"  - {{name: r{i}, devices: {len(g)}, gpu: [{', '.join(g)}]}}" for i, g in enumerate(per_region))
    links = "\n".join(f"  - {{between: [r{a}, r{b}], gbps: 1, ms: 5}}" for a in range(len(per_region))
                      for b in range(a + 1, len(per_region)))
    text = f"name: h\nregions:\n{regions}\nlinks:\n{links or '  []'}\ndefaults: {{intra: {{gbps: 10, ms: 0.1}}}}\n"
    cluster = parse_cluster_text(text.replace("links:\n  []", "links: []"), "h.yaml")
    assert list(cluster.gpus) == [g for gpus in per_region for g in gpus]
    again = parse_cluster_text(json.dumps(cluster_to_dict(cluster)), "again")
    assert again.gpus == cluster.gpus and again.fingerprint() == cluster.fingerprint()
