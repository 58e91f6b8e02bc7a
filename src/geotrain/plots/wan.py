"""Validation loss against emulated wall time, one line per `geotrain bench wan` row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


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
    ax.set_xscale("log")
    ax.set_xlabel("emulated wall time (s, log scale)")
    ax.set_ylabel("validation loss (nats per character)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title, fontsize=10)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out
