"""Where a run's time went: per rank and per site, from its metrics lines (geotrain.observe.metrics).

`time_split(steps)` gives, per rank and per site, the mean seconds per step of compute, communication (DP
collectives) and waiting, their shares of the step, and the payload bytes sent inside and between regions
(totals). Means are over the steps after the first (the first pays one-off set-up costs; all steps when there
is one). A site's figures are the means over its ranks. `holding_back(split)` names the site whose ranks
wait least while the others wait: the one the rest wait for (never in an asynchronous run: no rank waits for
another's step). `loss_lines` gives the loss panel's points, `plot_run` draws the report's four panels.

Time on the plots is measured from the loop's start (the earliest step's start: the processes' start-up is not
on the axis), emulated seconds when the lines carry them, else wall seconds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from geotrain.observe.rank_spread import MAX_RANK_BARS, rank_spread

PARTS = ("compute_s", "comm_s", "wait_s")
MARGIN_PCT = 5.0
"""`holding_back` names a site only when the others wait at least this many points of the step more."""


def _steady(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    first = min((s["step"] for s in steps), default=0)
    later = [s for s in steps if s["step"] != first]
    return later or list(steps)


def _row(group: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = len(group)
    row: dict[str, Any] = {"steps": len({s["step"] for s in group})}
    step_s = sum(s["step_s"] for s in group) / n
    row["step_s"] = step_s
    for key in PARTS:
        row[key] = sum(s[key] for s in group) / n
        row[key.replace("_s", "_pct")] = 100.0 * row[key] / step_s if step_s > 0 else 0.0
    for key in ("bytes_intra", "bytes_inter"):
        known = [s[key] for s in group if s.get(key) is not None]
        row[key] = float(sum(known)) if known else None
    return row


def time_split(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """{"ranks": [{rank, site, stage, replica, steps, step_s, compute_s, comm_s, wait_s, *_pct, bytes_*}],
    "sites": [{site, ranks, ...same means...}], "steps_used": first..last, "asynchronous", "uneven"}. Seconds are
    means per step (steps after the first); bytes are sums over those steps. `uneven`: ranks took different numbers
    of steps (a step's run progress is not its index), so `steps_used` spans the ranks' own counts."""
    steady = _steady([s for s in steps if s.get("compute_s") is not None])  # elastic groups' lines: no split
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in steady:
        by_rank[s["rank"]].append(s)
    ranks = []
    for rank in sorted(by_rank):
        head = by_rank[rank][0]
        ranks.append({"rank": rank, "site": head["site"], "stage": head["stage"], "replica": head["replica"],
                      **_row(by_rank[rank])})
    by_site: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in ranks:
        by_site[row["site"]].append(row)
    sites = []
    for site, rows in by_site.items():
        n = len(rows)
        entry: dict[str, Any] = {"site": site, "ranks": [r["rank"] for r in rows]}
        for key in ("step_s", *PARTS, "compute_pct", "comm_pct", "wait_pct"):
            entry[key] = sum(r[key] for r in rows) / n
        for key in ("bytes_intra", "bytes_inter"):
            known = [r[key] for r in rows if r[key] is not None]
            entry[key] = float(sum(known)) if known else None
        sites.append(entry)
    used = sorted({s["step"] for s in steady})
    return {"ranks": ranks, "sites": sites, "steps_used": [used[0], used[-1]] if used else [],
            "asynchronous": any(s.get("global_updates") is not None for s in steps),
            "uneven": any(s.get("progress_step") not in (None, s["step"]) for s in steps)}


def holding_back(split: dict[str, Any]) -> dict[str, Any] | None:
    """The site the others wait for: the least waiting share among sites, when another site waits more
    (None with one site, or when the others wait less than MARGIN_PCT points more).
    Returns {site, wait_pct, others_wait_pct, compute_s, others_compute_s}. None in an asynchronous run: there a
    rank's wait is host work, not a peer (its exchange with the server is comm)."""
    sites = split["sites"]
    if len(sites) < 2 or split.get("asynchronous"):
        return None
    slow = min(sites, key=lambda s: (s["wait_pct"], -s["compute_s"]))
    others = [s for s in sites if s is not slow]
    others_wait = sum(s["wait_pct"] for s in others) / len(others)
    if others_wait < slow["wait_pct"] + MARGIN_PCT:
        return None
    return {"site": slow["site"], "wait_pct": slow["wait_pct"], "others_wait_pct": others_wait,
            "compute_s": slow["compute_s"], "others_compute_s": sum(s["compute_s"] for s in others) / len(others)}


def loop_origin(steps: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """(emulated, wall) seconds of the loop's start: the earliest step's start (emulated_start_s; wall: t_wall less
    step_s, the step's own span when it was measured in wall seconds)."""
    emulated = [float(s["emulated_start_s"]) for s in steps if s.get("emulated_start_s") is not None]
    wall = min((float(s["t_wall"]) - (0.0 if s.get("emulated_start_s") is not None else float(s["step_s"]))
                for s in steps), default=0.0)
    return (min(emulated) if emulated else 0.0), wall


def _time_of(record: dict[str, Any], origin: tuple[float, float]) -> float:
    """A record's time for the plots since the loop's start (loop_origin): its emulated end when emulated, else
    wall seconds."""
    for key in ("emulated_end_s", "emulated_s"):
        if record.get(key) is not None:
            return float(record[key]) - origin[0]
    return float(record["t_wall"]) - origin[1]


MAX_LOSS_LINES = 8
"""Up to this many replicas the loss panel draws one line per replica; above it, one per site."""


def loss_lines(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The loss panel's points, each list in time order (seconds since loop_origin): {"lines": {label: [(t, loss)]}
    one per replica ("replica r (site)"; per site above MAX_LOSS_LINES replicas), "validation": [(t, loss)] one
    point per evaluation}. Ranks that take different numbers of steps (adaptive, asynchronous) keep their own line,
    so no line runs back in time. The ranks of one evaluation all record its loss (an all-reduce: the same float),
    each on a step that ends at its own time; the point sits at the latest of them, when the last rank joined it.
    A replica's own evaluation (asynchronous --eval-local) has a loss of its own, so a point of its own."""
    origin = loop_origin(steps)
    many = len({s["replica"] for s in steps}) > MAX_LOSS_LINES
    lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
    evaluations: dict[float, float] = {}  # loss -> the latest time a rank recorded it
    for s in steps:
        t = _time_of(s, origin)
        if s.get("loss") is not None:
            lines[s["site"] if many else f"replica {s['replica']} ({s['site']})"].append((t, float(s["loss"])))
        if s.get("val_loss") is not None:
            loss = float(s["val_loss"])
            evaluations[loss] = max(t, evaluations.get(loss, t))
    return {"lines": {label: sorted(points) for label, points in sorted(lines.items())},
            "validation": sorted((t, loss) for loss, t in evaluations.items())}


def plot_run(steps: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]], path: Path | str,
             title: str = "") -> Path:
    """A PNG of four panels: loss against time (sync and failure markers), per-site mean compute / comm /
    wait per step (stacked bars), cumulative inter-region bytes per site over time, per-rank bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    split = time_split(steps)
    origin = loop_origin(steps)
    emulated = any(s.get("emulated_end_s") is not None for s in steps)
    unit = "emulated s" if emulated else "wall s"
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (loss_ax, site_ax), (bytes_ax, rank_ax) = axes

    points = loss_lines(steps)
    for label, line in points["lines"].items():
        loss_ax.plot([t for t, _ in line], [v for _, v in line], marker=".", markersize=3, linewidth=1,
                     label=f"loss, {label}")
    if points["validation"]:
        loss_ax.plot([t for t, _ in points["validation"]], [v for _, v in points["validation"]], "o", color="black",
                     markersize=5, label="validation (every replica's weights on its share of the windows)")
    marked: set[str] = set()
    for e in events:
        style = {"outer_sync": ("tab:green", "--"), "failure": ("tab:red", "-"), "checkpoint": ("grey", ":"),
                 "rejoin": ("tab:purple", "-."), "replan": ("black", "-")}
        if e["event"] not in style or e.get("phase") == "start":  # a sync is marked where it lands
            continue
        color, line = style[e["event"]]
        loss_ax.axvline(_time_of(e, origin), color=color, linestyle=line, linewidth=0.8,
                        label=e["event"] if e["event"] not in marked else None)
        marked.add(e["event"])
    loss_ax.set(xlabel=f"time since the loop's start ({unit})", ylabel="loss (nats)", title="loss against time")
    loss_ax.legend(fontsize=8)

    colors = {"compute_s": "tab:blue", "comm_s": "tab:orange", "wait_s": "tab:red"}
    for ax, rows, label in ((site_ax, split["sites"], "site"), (rank_ax, split["ranks"], "rank")):
        if label == "rank" and len(rows) > MAX_RANK_BARS:  # 3,000 bars are unreadable: each site's spread
            rank_spread(ax, rows, unit, colors)
            continue
        names = [r["site"] if label == "site" else f"r{r['rank']}\n{r['site']}" for r in rows]
        bottom = [0.0] * len(rows)
        for key in PARTS:
            values = [r[key] for r in rows]
            ax.bar(names, values, bottom=bottom, color=colors[key], label=key.replace("_s", ""))
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set(ylabel=f"{unit} per step (mean)", title=f"where the step goes, per {label}")
        ax.legend(fontsize=8)
    rank_ax.tick_params(axis="x", labelsize=7)

    per_site: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in sorted(steps, key=lambda s: _time_of(s, origin)):
        if s.get("bytes_inter") is not None:
            per_site[s["site"]].append((_time_of(s, origin), float(s["bytes_inter"])))
    for site, points in sorted(per_site.items()):
        total, xs_b, ys_b = 0.0, [], []
        for t, b in points:
            total += b
            xs_b.append(t)
            ys_b.append(total / 1e6)
        bytes_ax.step(xs_b, ys_b, where="post", label=site)
    bytes_ax.set(xlabel=f"time since the loop's start ({unit})", ylabel="MB sent to other regions (cumulative)",
                 title="inter-region bytes over time, by sending site")
    if per_site:
        bytes_ax.legend(fontsize=8)
    else:
        bytes_ax.text(0.5, 0.5, "no emulated links: bytes per region unknown", ha="center",
                      transform=bytes_ax.transAxes)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def observer_cost(steps: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """What writing the metrics cost the ranks, from their "end" events: wall seconds in the observer per
    step per rank, as a share of the mean wall seconds between a rank's consecutive steps, and metrics
    bytes per step per rank (None when no rank ended normally)."""
    ends = [e for e in events if e["event"] == "end" and e.get("steps")]
    if not ends:
        return None
    n_steps = sum(e["steps"] for e in ends)
    per_step_s = sum(e["observer_s"] for e in ends) / n_steps
    walls: dict[int, list[float]] = defaultdict(list)
    for s in steps:
        walls[s["rank"]].append(float(s["t_wall"]))
    gaps = [(max(w) - min(w)) / (len(w) - 1) for w in walls.values() if len(w) > 1]
    step_wall_s = sum(gaps) / len(gaps) if gaps else None
    return {"observer_s_per_step": per_step_s, "bytes_per_step": sum(e["bytes_written"] for e in ends) / n_steps,
            "step_wall_s": step_wall_s,
            "overhead_pct": None if not step_wall_s else 100.0 * per_step_s / step_wall_s, "ranks": len(ends)}
