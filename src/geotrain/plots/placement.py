"""Picture of a placement: devices grouped by region, each labelled with its (stage, replica) slot,
pipeline links coloured by bandwidth; beside it the region-pair bandwidth / latency matrix."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from geotrain.cluster import Cluster


def _device_positions(cluster: Cluster) -> np.ndarray:
    """(N, 2) positions: regions on a circle, each region's devices on a small grid around its centre."""
    positions = np.zeros((cluster.n_devices, 2))
    n_regions = cluster.n_regions
    radius = 0.0 if n_regions == 1 else 3.2 + 0.4 * n_regions
    for g in range(n_regions):
        angle = math.pi / 2 - 2 * math.pi * g / n_regions
        centre = np.array([radius * math.cos(angle), radius * math.sin(angle)])
        devices = cluster.devices_in_region(g)
        cols = max(1, math.ceil(math.sqrt(len(devices))))
        rows = math.ceil(len(devices) / cols)
        for k, d in enumerate(devices):
            offset = np.array([k % cols - (cols - 1) / 2, (rows - 1) / 2 - k // cols]) * 0.9
            positions[d] = centre + offset
    return positions


def plot_placement(cluster: Cluster, assignment: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Write a PNG of `assignment[s][r]` on `cluster` to `path`; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    assignment = np.asarray(assignment)
    stages, replicas = assignment.shape
    positions = _device_positions(cluster)
    figure, (ax, ax_links) = plt.subplots(1, 2, figsize=(15, 7.5), gridspec_kw={"width_ratios": [1.6, 1]})
    off = ~np.eye(cluster.n_devices, dtype=bool)
    norm = LogNorm(vmin=float(cluster.bandwidth_gbps[off].min()) if cluster.n_devices > 1 else 1.0,
                   vmax=float(cluster.bandwidth_gbps[off].max()) if cluster.n_devices > 1 else 10.0)
    cmap = plt.get_cmap("viridis")

    for g, name in enumerate(cluster.region_names):
        members = positions[cluster.devices_in_region(g)]
        lo, hi = members.min(axis=0) - 0.6, members.max(axis=0) + 0.6
        ax.add_patch(plt.Rectangle(lo, *(hi - lo), fill=False, linestyle="--", color="0.6"))
        ax.text((lo[0] + hi[0]) / 2, hi[1] + 0.15, name, ha="center", va="bottom", fontsize=10, weight="bold")
    for r in range(replicas):
        for s in range(stages - 1):
            a, b = assignment[s, r], assignment[s + 1, r]
            (x0, y0), (x1, y1) = positions[a], positions[b]
            ax.plot([x0, x1], [y0, y1], color=cmap(norm(cluster.bandwidth_gbps[a, b])), linewidth=1.6, alpha=0.85, zorder=1)
    stage_colours = plt.get_cmap("tab10")
    slot_of = {int(d): (s, r) for (s, r), d in np.ndenumerate(assignment)}
    for d in range(cluster.n_devices):
        x, y = positions[d]
        if d in slot_of:
            s, r = slot_of[d]
            ax.scatter([x], [y], s=430, color=stage_colours(s % 10), edgecolors="black", zorder=2)
            ax.text(x, y, f"s{s}\nr{r}", ha="center", va="center", fontsize=6.5, zorder=3)
        else:
            ax.scatter([x], [y], s=430, color="0.9", edgecolors="0.5", zorder=2)
            ax.text(x, y, "-", ha="center", va="center", fontsize=7, zorder=3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"{cluster.name}: {stages} stages x {replicas} replicas (colour = stage, lines = pipelines)",
                 fontsize=10)
    colourbar = figure.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, fraction=0.03, pad=0.01)
    colourbar.set_label("pipeline link bandwidth (Gbit/s)")

    n_regions = cluster.n_regions
    region_gbps = np.zeros((n_regions, n_regions))
    region_ms = np.zeros((n_regions, n_regions))
    for a in range(n_regions):
        for b in range(n_regions):
            block = np.ix_(cluster.devices_in_region(a), cluster.devices_in_region(b))
            mask = off[block]
            region_gbps[a, b] = cluster.bandwidth_gbps[block][mask].mean() if mask.any() else np.nan
            region_ms[a, b] = cluster.latency_ms[block][mask].mean() if mask.any() else np.nan
    ax_links.imshow(np.where(np.isnan(region_gbps), norm.vmin, region_gbps), cmap=cmap, norm=norm)
    for a in range(n_regions):
        for b in range(n_regions):
            if not np.isnan(region_gbps[a, b]):
                ax_links.text(b, a, f"{region_gbps[a, b]:.2g} Gb/s\n{region_ms[a, b]:.3g} ms", ha="center", va="center",
                              fontsize=7, color="white" if float(norm(region_gbps[a, b])) < 0.6 else "black")
    ax_links.set_xticks(range(n_regions), cluster.region_names, rotation=45, ha="right")
    ax_links.set_yticks(range(n_regions), cluster.region_names)
    ax_links.set_title("region links: mean bandwidth and latency", fontsize=10)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
