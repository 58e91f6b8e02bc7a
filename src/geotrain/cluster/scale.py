"""Large seeded clusters for scale benchmarks: multi-cloud regions with mixed GPU types.

`multicloud(n_regions, devices_per_region, seed)` places regions at random points of a 20 000 km x
10 000 km map; between two regions the one-way latency is 5 ms + distance / (100 km/ms) (fibre at
~200 km/ms, routes about twice the straight line) and the bandwidth falls with distance from 2.5 to
0.3 Gbit/s (long-haul TCP throughput is latency-bound), each times a seeded factor in 0.8..1.2.
Inside a region: 10..50 Gbit/s and 0.1..0.5 ms. GPU type per region is drawn from GPU_MIX.
`jitter` > 0 multiplies every device pair's bandwidth by a symmetric factor in 1 +- jitter, so the
cluster is no longer region-uniform (the exact MILP then does not apply; bounds still do).
"""

from __future__ import annotations

import numpy as np

from geotrain.cluster.errors import ClusterError
from geotrain.cluster.generators import region_cluster
from geotrain.cluster.model import Cluster

GPU_MIX = ("A100", "V100", "T4", "H100", "A10G", "L4")
REGION_NAMES = ("us-east", "us-west", "us-central", "eu-west", "eu-central", "ap-northeast", "ap-southeast",
                "sa-east", "me-central", "af-south", "ap-south", "ca-central")


def multicloud(n_regions: int = 8, devices_per_region: int = 128, seed: int = 0, jitter: float = 0.0,
               name: str | None = None) -> Cluster:
    """A seeded multi-cloud cluster of n_regions x devices_per_region devices (see the module docstring)."""
    if n_regions < 1 or devices_per_region < 1:
        raise ClusterError(f"need >= 1 region and >= 1 device per region, got {n_regions} x {devices_per_region}")
    if not 0.0 <= jitter < 1.0:
        raise ClusterError(f"jitter must be in [0, 1), got {jitter}")
    rng = np.random.default_rng(seed)
    points = rng.uniform([0.0, 0.0], [20000.0, 10000.0], size=(n_regions, 2))
    km = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    latency = 5.0 + km / 100.0
    bandwidth = np.clip(2.5 - 2.2 * km / 22000.0, 0.3, 2.5)
    factor = rng.uniform(0.8, 1.2, size=(n_regions, n_regions))
    bandwidth = bandwidth * np.triu(factor, 1) + (bandwidth * np.triu(factor, 1)).T
    intra_gbps = rng.uniform(10.0, 50.0, size=n_regions)
    intra_ms = rng.uniform(0.1, 0.5, size=n_regions)
    np.fill_diagonal(bandwidth, intra_gbps)
    np.fill_diagonal(latency, intra_ms)
    gpus = [GPU_MIX[int(k)] for k in rng.integers(0, len(GPU_MIX), size=n_regions)]
    names = [REGION_NAMES[g % len(REGION_NAMES)] + ("" if g < len(REGION_NAMES) else f"-{g // len(REGION_NAMES)}")
             for g in range(n_regions)]
    label = name or f"multicloud-{n_regions}x{devices_per_region}-seed{seed}" + (f"-jitter{jitter:g}" if jitter else "")
    cluster = region_cluster(label, names, [devices_per_region] * n_regions, np.round(bandwidth, 4),
                             np.round(latency, 3), gpus)
    if not jitter:
        return cluster
    n = cluster.n_devices
    noise = rng.uniform(1.0 - jitter, 1.0 + jitter, size=(n, n))
    noise = np.triu(noise, 1) + np.triu(noise, 1).T
    return Cluster(name=label, device_names=cluster.device_names, region_names=cluster.region_names,
                   region_of=cluster.region_of, gpus=cluster.gpus, bandwidth_gbps=cluster.bandwidth_gbps * noise,
                   latency_ms=cluster.latency_ms, prices=cluster.prices, memory_gib=cluster.memory_gib)


def multicloud_1024() -> Cluster:
    """8 regions x 128 devices, mixed GPUs, region-uniform links (seed 0)."""
    return multicloud(8, 128, seed=0, name="multicloud-1024")


def multicloud_1024_jitter() -> Cluster:
    """multicloud-1024 with every device pair's bandwidth jittered by +-10 % (not region-uniform)."""
    return multicloud(8, 128, seed=0, jitter=0.1, name="multicloud-1024-jitter")
