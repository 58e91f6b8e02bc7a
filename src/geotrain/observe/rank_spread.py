"""The report plot's per-rank panel for runs of many ranks: a bar per rank stops being readable past
MAX_RANK_BARS (3,000 labels on one axis), so the panel shows each site's ranks as a spread instead.

Per site, a box plot per part of the step side by side (compute, comm, wait: the mean seconds per step of
each of the site's ranks; the box spans the middle half of the ranks, the whiskers the rest within 1.5 x the
box, outliers as points), labelled with the site and its rank count. A rank unlike its site is an outlier.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

MAX_RANK_BARS = 32
"""Up to this many ranks the panel draws a stacked bar per rank; above it, a spread per site."""


def rank_spread(ax: Any, ranks: Sequence[dict[str, Any]], unit: str, colors: dict[str, str]) -> list[str]:
    """Draw the per-site spread of `ranks` (time_split's rows) on the matplotlib axes `ax`, a box per part of
    `colors` ({"compute_s": color, ...}, in that order); returns the tick labels, one per site in first-seen
    order ("<site>", a newline, "<n> ranks")."""
    by_site: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in ranks:
        by_site[row["site"]].append(row)
    width = 0.8 / len(colors)
    for k, (key, color) in enumerate(colors.items()):
        data = [[r[key] for r in rows] for rows in by_site.values()]
        positions = [i + (k - (len(colors) - 1) / 2) * width for i in range(len(data))]
        boxes = ax.boxplot(data, positions=positions, widths=width * 0.9, patch_artist=True, manage_ticks=False,
                           flierprops={"markersize": 2}, medianprops={"color": "black"})
        for box in boxes["boxes"]:
            box.set_facecolor(color)
        boxes["boxes"][0].set_label(key.replace("_s", ""))
    labels = [f"{site}\n{len(rows)} ranks" for site, rows in by_site.items()]
    ax.set_xticks(range(len(labels)), labels)
    ax.set(ylabel=f"{unit} per step (mean of a rank)",
           title=f"per rank: the spread over each site's ranks ({len(ranks)} ranks)")
    ax.legend(fontsize=8)
    return labels
