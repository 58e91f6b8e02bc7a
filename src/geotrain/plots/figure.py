"""The common ending of geotrain's log-x line/scatter figures: axes, grid, legend, title, PNG file."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def finish_log_x(figure: Any, ax: Any, xlabel: str, ylabel: str, title: str | None, path: str | Path) -> Path:
    """Log-scale x axis, labels, grid, legend and title; write `path` (PNG, 120 dpi), close; return it."""
    import matplotlib.pyplot as plt

    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title, fontsize=10)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out
