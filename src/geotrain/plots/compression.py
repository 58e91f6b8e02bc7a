"""Scatter of validation bits per character against traffic (relative to fp32), one series per table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from geotrain.plots.figure import finish_log_x


def plot_bpc_vs_traffic(series: Mapping[str, Sequence[tuple[str, float, float]]], path: str | Path,
                        title: str = "") -> Path:
    """Write a PNG to `path`: for each series name, points (label, traffic / fp32, validation bpc).

    Traffic is on a log axis (compression spans 1x to ~1/50x); every point is labelled.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(9, 6))
    markers = "osD^v<>"
    for i, (name, points) in enumerate(series.items()):
        if not points:
            continue
        xs = [traffic for _, traffic, _ in points]
        ys = [bpc for _, _, bpc in points]
        ax.scatter(xs, ys, marker=markers[i % len(markers)], s=50, label=name, zorder=2)
        for label, x, y in points:
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    return finish_log_x(figure, ax, "traffic / fp32 (log scale)", "validation bits per character (lower is better)", title, path)
