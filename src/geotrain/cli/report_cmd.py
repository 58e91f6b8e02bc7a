"""`geotrain report RUN_DIR`: where a run's time went, per site and per rank, from its run directory.

    geotrain report geotrain-runs/20261205-160102-plan [--json] [--plot FILE.png] [--tensorboard]

Tables (or one JSON object with --json: {"run_dir", "about", "split": {"ranks", "sites", "steps_used"},
"holding_back", "events", "observer_cost", "plot", "tensorboard"}) of the mean seconds per step of compute,
communication and waiting, their shares, and the bytes sent inside and between regions (geotrain.observe.report);
"observer_cost": what writing the metrics cost each rank per step (seconds, share of the step, bytes).
--plot draws the four panels; --tensorboard (re)writes the TensorBoard scalars from the metrics.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from geotrain.cli.arg_types import output_file
from geotrain.cli.output import Output
from geotrain.observe.rundir import RunDirError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="where a run's time went: per site and per rank compute / comm / wait, bytes, plots",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (`geotrain train` prints it at start)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of tables")
    parser.add_argument("--plot", type=output_file, metavar="FILE.png",
                        help="loss against time, per-site compute/comm/wait bars, inter-region bytes over time")
    parser.add_argument("--tensorboard", action="store_true",
                        help="(re)write the TensorBoard scalars under RUN_DIR/tensorboard from the metrics")
    parser.set_defaults(handler=run)


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.3f}"


def _rows(entries: list[dict[str, Any]], first: list[str]) -> list[list[Any]]:
    return [[*(e[k] for k in first), f"{e['step_s']:.3f}", f"{e['compute_s']:.3f}", f"{e['comm_s']:.3f}",
             f"{e['wait_s']:.3f}", f"{e['compute_pct']:.0f}/{e['comm_pct']:.0f}/{e['wait_pct']:.0f}",
             _mb(e["bytes_intra"]), _mb(e["bytes_inter"])] for e in entries]


COLUMNS = ["step s", "compute s", "comm s", "wait s", "% c/m/w", "MB intra", "MB inter"]


def run(args: Any) -> int:
    from geotrain.observe.metrics import events_of, read_metrics, steps_of
    from geotrain.observe.report import holding_back, observer_cost, plot_run, time_split
    from geotrain.observe.rundir import read_about

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"report: {run_dir}: no such directory")
    records = read_metrics(run_dir)
    steps, events = steps_of(records), events_of(records)
    if not steps:
        raise RunDirError(f"report: {run_dir}: no step records under metrics/ (did the run reach a step?)")
    about = read_about(run_dir)
    split = time_split(steps)
    slow = holding_back(split)
    cost = observer_cost(steps, events)
    # an outer sync is counted once, where it lands
    counts = dict(Counter(e["event"] for e in events if e["event"] not in ("start", "end") and e.get("phase") != "start"))
    if args.plot:
        plot_run(steps, events, args.plot, title=f"{about.get('plan', run_dir.name)} on {about.get('cluster', '?')}")
    board = None
    if args.tensorboard:
        from geotrain.observe.tensorboard import write_scalars

        board = write_scalars(run_dir, steps)
    out = Output(json_mode=args.json)
    if args.json:
        out.emit_json({"run_dir": str(run_dir), "about": about, "split": split, "holding_back": slow,
                       "events": counts, "observer_cost": cost, "plot": args.plot,
                       "tensorboard": None if board is None else str(board)})
        return 0
    used = split["steps_used"]
    unit = "emulated" if any(s.get("emulated_end_s") is not None for s in steps) else "wall"
    if not used:  # an elastic run's lines: loss and step seconds, no compute / comm / wait split
        mean = sum(s["step_s"] for s in steps) / len(steps)
        out.text(f"{len(steps)} step lines of {len({s['rank'] for s in steps})} ranks, mean {mean:.3f} s a step; "
                 "no compute / comm / wait split in this run's lines (elastic groups do not measure it)")
    else:
        _split_tables(out, split, unit)
    _closing_lines(out, slow, counts, cost, args.plot, board)
    return 0


def _split_tables(out: Output, split: dict[str, Any], unit: str) -> None:
    used = split["steps_used"]
    out.table(f"per site: mean {unit} seconds per step over steps {used[0]}..{used[1]}; bytes summed",
              ["site", "ranks", *COLUMNS],
              [[e["site"], " ".join(map(str, e["ranks"])), *row[1:]]
               for e, row in zip(split["sites"], _rows(split["sites"], ["site"]), strict=True)])
    out.table("per rank", ["rank", "site", "stage", "replica", *COLUMNS],
              _rows(split["ranks"], ["rank", "site", "stage", "replica"]))


def _closing_lines(out: Output, slow: Any, counts: dict[str, int], cost: Any, plot: str | None, board: Any) -> None:
    if slow is not None:
        out.text(f"{slow['site']} holds the others back: its ranks wait {slow['wait_pct']:.0f}% of the step and "
                 f"compute {slow['compute_s']:.3f} s, the other sites wait {slow['others_wait_pct']:.0f}% "
                 f"(compute {slow['others_compute_s']:.3f} s)")
    if counts:
        out.text("events: " + ", ".join(f"{name} x{n}" for name, n in sorted(counts.items())))
    if cost is not None:
        share = "" if cost["overhead_pct"] is None else f" ({cost['overhead_pct']:.3f}% of a step's wall time)"
        out.text(f"metrics cost: {1e3 * cost['observer_s_per_step']:.3f} ms per step per rank{share}, "
                 f"{cost['bytes_per_step']:.0f} bytes per step per rank")
    if plot:
        out.text(f"plot: {plot}")
    if board is not None:
        out.text(f"tensorboard: {board}")
