"""Named clusters: `seed-geo` and `seed-datacenter` (the seed's demo 1)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from geotrain.cluster.errors import ClusterError
from geotrain.cluster.generators import make_network
from geotrain.cluster.io import load_cluster_file
from geotrain.cluster.model import Cluster
from geotrain.cluster.scale import multicloud_1024, multicloud_1024_jitter
from geotrain.cluster.yuan2022 import YUAN2022_PRESETS


def seed_geo() -> Cluster:
    """4 regions x 8 V100s; 10 Gbit/s, 0.1 ms inside; 0.3-1.3 Gbit/s, 10-250 ms between (seed 0)."""
    return make_network([8, 8, 8, 8], 10.0, (0.3, 1.3), (10.0, 250.0), seed=0, name="seed-geo")


def seed_datacenter() -> Cluster:
    """32 V100s in one datacenter, 25 Gbit/s and 0.1 ms between every pair."""
    return make_network([32], 25.0, (25.0, 25.0), (0.1, 0.1), seed=0, name="seed-datacenter")


CLUSTER_PRESETS: dict[str, Callable[[], Cluster]] = {
    "seed-geo": seed_geo,
    "seed-datacenter": seed_datacenter,
    **YUAN2022_PRESETS,
    "multicloud-1024": multicloud_1024,
    "multicloud-1024-jitter": multicloud_1024_jitter,
}


def load_cluster(spec: str | Path) -> Cluster:
    """A preset name, or the path of a YAML/JSON cluster file."""
    if isinstance(spec, str) and spec in CLUSTER_PRESETS:
        return CLUSTER_PRESETS[spec]()
    path = Path(spec)
    if not path.exists():
        known = ", ".join(sorted(CLUSTER_PRESETS))
        raise ClusterError(f"{spec}: neither a cluster preset ({known}) nor an existing file")
    return load_cluster_file(path)
