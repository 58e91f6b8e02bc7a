"""`memory_gib` in cluster files: the GPU memory a job may use per device where it is less than the datasheet's
(a MIG slice, a shared GPU); the planner's memory checks read `Cluster.memory_bytes`."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from geotrain.cluster import ClusterFileError, parse_cluster_text
from geotrain.cluster.gpus import gpu_memory_bytes
from geotrain.cluster.io import cluster_to_dict, cluster_from_dict
from geotrain.cluster.membership import restrict_cluster
from geotrain.cli.plan_recipe import devices_that_fit, too_few_devices
from geotrain.cost.shards import slot_cluster

COMPACT = """name: sliced
regions:
  - {name: a, devices: 2, gpu: A100, memory_gib: 10, intra: {gbps: 100, ms: 0.1}}
  - {name: b, devices: 2, gpu: T4, intra: {gbps: 100, ms: 0.1}}
links:
  - {between: [a, b], gbps: 1, ms: 20}
"""


def test_a_region_caps_its_devices_memory_and_the_others_keep_the_datasheet():
    cluster = parse_cluster_text(COMPACT)
    assert cluster.memory_bytes.tolist() == [10 * 2.0**30] * 2 + [gpu_memory_bytes("T4")] * 2
    assert math.isnan(cluster.memory_gib[2])
    # the planner's checks: 12 GB fits only the T4s (16 GiB), not the A100s capped at 10 GiB
    fit = devices_that_fit(cluster, 12e9)
    assert fit.tolist() == [2, 3]
    assert "too small: A100 (11 GB) x2" in too_few_devices(cluster, 12e9, fit, "1 x 4")


def test_defaults_and_the_dense_form_and_a_written_file_reads_back_the_same():
    text = COMPACT.replace(" memory_gib: 10,", "") + "defaults: {memory_gib: 4}\n"
    cluster = parse_cluster_text(text)
    assert cluster.memory_gib.tolist() == [4.0] * 4
    again = cluster_from_dict(cluster_to_dict(cluster, "dense"))
    assert again.memory_gib.tolist() == [4.0] * 4 and again.fingerprint() == cluster.fingerprint()
    mixed = parse_cluster_text(COMPACT)
    back = cluster_from_dict(cluster_to_dict(mixed))
    assert np.array_equal(back.memory_bytes, mixed.memory_bytes) and back.fingerprint() == mixed.fingerprint()


def test_the_fingerprint_changes_with_a_limit_and_not_without_one():
    plain = parse_cluster_text(COMPACT.replace(" memory_gib: 10,", ""))
    limited = parse_cluster_text(COMPACT)
    assert plain.fingerprint() != limited.fingerprint()
    assert "memory_gib" not in str(cluster_to_dict(plain))


def test_a_kept_device_keeps_its_limit_and_a_slot_takes_its_smallest():
    cluster = parse_cluster_text(COMPACT)
    assert restrict_cluster(cluster, [1, 2]).memory_bytes.tolist() == [10 * 2.0**30, gpu_memory_bytes("T4")]
    slots = slot_cluster(cluster, np.array([[0, 1], [2, 3]]))
    assert slots.memory_bytes.tolist() == [10 * 2.0**30, gpu_memory_bytes("T4")]


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.booleans(), st.text(max_size=5)))
def test_a_memory_that_is_not_a_positive_number_of_gib_is_refused_naming_its_key(value):
    ok = (not isinstance(value, (bool, str)) and isinstance(value, (int, float)) and 0 < value <= 65536)
    doc = {"name": "x", "regions": [{"name": "a", "devices": 1, "gpu": "T4", "memory_gib": value}]}
    if ok:
        assert cluster_from_dict(doc).memory_gib.tolist() == [float(value)]
    else:
        with pytest.raises(ClusterFileError, match=r"regions\[0\]\.memory_gib: must be a number of GiB"):
            cluster_from_dict(doc)
