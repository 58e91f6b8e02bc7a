"""Group measured devices into regions: hierarchical clustering, cut at the largest significant gap.

Rule (the same for both metrics, with different distances and noise floors):
1. distance between devices i and j: latency_ms (one-way), or for bandwidth 1 / bandwidth_gbps
   (seconds per Gbit: slow links are far apart); average linkage (scipy.cluster.hierarchy).
2. The merge heights h_1 <= ... <= h_{n-1}, each raised to at least the metric's noise floor, with the
   floor itself prepended as h_0 (so "everything is within noise" is a height too).
3. A gap between h_k and h_{k+1} is *significant* when h_{k+1} / h_k >= GAP_RATIO (2) and
   h_{k+1} - h_k >= the noise floor. The cut goes in the lowest significant gap (at the geometric
   mean of h_k and h_{k+1}): regions are the groups of devices nearer to each other than the first
   jump above the within-site spread, even when sites are unevenly far apart. No significant gap:
   one region.
4. `regions_from_measurements` clusters on latency when latency gives a significant cut (the
   natural signal of geography: sites are milliseconds apart, hosts in one site are not), else on
   bandwidth, else returns one region; it says which it used.

The latency floor defaults to 1 ms: one-way differences below it are scheduler and stack noise on
shared hosts, and no two sites of a geo cluster are closer than that. Bandwidth needs no floor (its
noise is ~10%, far below the factor 2); with only two devices there is no within-region merge to
compare to, so bandwidth alone cannot split them (latency can, against its floor).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

GAP_RATIO = 2.0
LATENCY_NOISE_MS = 1.0


@dataclass(frozen=True)
class RegionSplit:
    """Region label per device (0.. in order of first appearance), the metric used, and the cut."""

    labels: tuple[int, ...]
    metric: str          # "latency", "bandwidth" or "none" (one region: no significant gap)
    cut: float           # cut height in the metric's distance unit (ms, or s/Gbit); 0 for "none"
    ratio: float         # h_{k+1}/h_k at the cut (without a cut: the largest ratio found)

    @property
    def n_regions(self) -> int:
        return len(set(self.labels))


def _ordered(labels: np.ndarray) -> tuple[int, ...]:
    """Relabel so that region 0 holds device 0, region 1 the first device not in region 0, ..."""
    mapping: dict[int, int] = {}
    return tuple(mapping.setdefault(int(label), len(mapping)) for label in labels)


def split_by_distance(distance: np.ndarray, floor: float, metric: str) -> RegionSplit:
    """Cluster a symmetric distance matrix by the module's rule with noise floor `floor` (>= 0)."""
    n = distance.shape[0]
    if n < 2:
        return RegionSplit(labels=(0,) * n, metric="none", cut=0.0, ratio=1.0)
    condensed = squareform(np.maximum(distance, floor) * (1 - np.eye(n)), checks=False)
    tree = linkage(condensed, method="average")
    heights = np.sort(tree[:, 2])
    if floor > 0:
        heights = np.concatenate([[floor], heights])
    if len(heights) < 2:
        return RegionSplit(labels=(0,) * n, metric="none", cut=0.0, ratio=1.0)
    ratios = heights[1:] / heights[:-1]
    significant = np.flatnonzero((ratios >= GAP_RATIO) & (np.diff(heights) >= floor))
    if len(significant) == 0:
        return RegionSplit(labels=(0,) * n, metric="none", cut=0.0, ratio=float(ratios.max()))
    k = int(significant[0])
    cut = float(np.sqrt(heights[k] * heights[k + 1]))
    return RegionSplit(labels=_ordered(fcluster(tree, t=cut, criterion="distance")), metric=metric,
                       cut=cut, ratio=float(ratios[k]))


def regions_from_measurements(latency_ms: np.ndarray, bandwidth_gbps: np.ndarray,
                              latency_noise_ms: float = LATENCY_NOISE_MS) -> RegionSplit:
    """Regions from symmetric measured matrices (diagonal ignored): latency first, then bandwidth."""
    by_latency = split_by_distance(np.asarray(latency_ms, dtype=float), latency_noise_ms, "latency")
    if by_latency.metric != "none":
        return by_latency
    bandwidth = np.asarray(bandwidth_gbps, dtype=float)
    with np.errstate(divide="ignore"):
        seconds_per_gbit = np.where(bandwidth > 0, 1.0 / np.where(bandwidth > 0, bandwidth, 1.0), np.inf)
    np.fill_diagonal(seconds_per_gbit, 0.0)
    return split_by_distance(seconds_per_gbit, 0.0, "bandwidth")
