"""Seeded cluster generators."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from geotrain.cluster.errors import ClusterError
from geotrain.errors import shown
from geotrain.cluster.model import Cluster, check_device_count


def region_cluster(
    name: str,
    region_names: Sequence[str],
    region_sizes: Sequence[int],
    region_bandwidth_gbps: np.ndarray,
    region_latency_ms: np.ndarray,
    gpus: Sequence[str] | str = "unknown",
) -> Cluster:
    """Expand R x R region-level link matrices (diagonal = inside a region) to a device-level Cluster.

    `gpus` is one GPU type for all regions or one per region.
    """
    sizes = np.asarray(region_sizes, dtype=np.int64)
    if len(region_names) != len(sizes) or np.any(sizes < 1):
        raise ClusterError(f"region_sizes must be one integer >= 1 per region, got {shown(list(region_sizes))}")
    check_device_count(int(sizes.sum()), f"cluster {shown(name)}")
    per_region = [gpus] * len(sizes) if isinstance(gpus, str) else list(gpus)
    if len(per_region) != len(sizes):
        raise ClusterError(f"gpus must be one name or one per region ({len(sizes)}), got {len(per_region)}")
    region_of = np.repeat(np.arange(len(sizes)), sizes)
    return Cluster(
        name=name,
        device_names=tuple(f"{region_names[r]}-{k}" for r, size in enumerate(sizes) for k in range(size)),
        region_names=tuple(region_names),
        region_of=region_of,
        gpus=tuple(per_region[r] for r in region_of),
        bandwidth_gbps=np.asarray(region_bandwidth_gbps, dtype=float)[np.ix_(region_of, region_of)],
        latency_ms=np.asarray(region_latency_ms, dtype=float)[np.ix_(region_of, region_of)],
    )


def make_network(
    region_sizes: Sequence[int],
    intra_gbps: float,
    inter_gbps_range: tuple[float, float],
    inter_latency_ms_range: tuple[float, float],
    seed: int,
    intra_ms: float = 0.1,
    gpu: str = "V100",
    name: str | None = None,
) -> Cluster:
    """The seed's random geo network: regions of the given sizes, uniform links inside each region,
    and each unordered region pair drawn once (bandwidth, then latency, uniformly in the ranges)
    from numpy's default_rng(seed), pairs in order (0,1), (0,2), ..., (1,2), ...
    """
    lo_bw, hi_bw = inter_gbps_range
    lo_ms, hi_ms = inter_latency_ms_range
    if intra_gbps <= 0 or lo_bw <= 0 or hi_bw < lo_bw:
        raise ClusterError(f"bandwidths must be > 0 with lo <= hi, got intra {intra_gbps}, inter {inter_gbps_range}")
    if intra_ms < 0 or lo_ms < 0 or hi_ms < lo_ms:
        raise ClusterError(f"latencies must be >= 0 with lo <= hi, got intra {intra_ms}, inter {inter_latency_ms_range}")
    n_regions = len(region_sizes)
    rng = np.random.default_rng(seed)
    bandwidth = np.full((n_regions, n_regions), float(intra_gbps))
    latency = np.full((n_regions, n_regions), float(intra_ms))
    for a in range(n_regions):
        for b in range(a + 1, n_regions):
            bandwidth[a, b] = bandwidth[b, a] = rng.uniform(lo_bw, hi_bw)
            latency[a, b] = latency[b, a] = rng.uniform(lo_ms, hi_ms)
    return region_cluster(
        name or f"geo-{'x'.join(map(str, region_sizes))}-seed{seed}",
        [f"region{r}" for r in range(n_regions)],
        region_sizes,
        bandwidth,
        latency,
        gpu,
    )
