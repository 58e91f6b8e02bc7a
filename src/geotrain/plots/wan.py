"""Validation loss against emulated wall time, one line per `geotrain bench wan` row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from geotrain.plots.figure import finish_log_x


def plot_loss_vs_time(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], path: str | Path,
                      target: float | None = None, title: str = "") -> Path:
    """Write a PNG to `path`: for each label, (emulated seconds, validation loss) points as a line;
    a dashed horizontal line at `target`. Time on a log axis (rows differ by up to ~10x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(9, 6))
    for i, (label, (times, losses)) in enumerate(curves.items()):
        ax.plot(times, losses, marker="osD^v<>"[i % 7], markersize=4, label=label)
    if target is not None:
        ax.axhline(target, linestyle="--", color="grey", linewidth=1, label=f"target {target:g}")
    return finish_log_x(figure, ax, "emulated wall time (s, log scale)", "validation loss (nats per character)", title, path)
