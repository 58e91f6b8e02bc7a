"""`geotrain report RUN_DIR`: where a run's time went, per site and per rank, from its run directory.

    geotrain report geotrain-runs/20261205-160102-plan [--json] [--plot FILE.png] [--tensorboard]

Tables (or one JSON object with --json: {"run_dir", "about", "split": {"ranks", "sites", "steps_used"},
"holding_back", "events", "observer_cost", "skipped_lines", "notes", "incomplete", "steps", "ranks", "plot",
"tensorboard"}: geotrain.observe.run_report) of the mean seconds per step of compute, communication and waiting,
their shares, and the bytes sent inside and between regions (geotrain.observe.report); "observer_cost": what
writing the metrics cost each rank per step (seconds, share of the step, bytes). A line that cannot be read is
skipped and counted ("skipped_lines", "notes"); a run whose ranks did not all end normally (killed, failed) is
marked "incomplete" with each such rank and why. --plot draws the four panels; --tensorboard (re)writes the
TensorBoard scalars from the metrics. An unwritable --plot path or run directory is refused before any work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from geotrain.cli.arg_types import plot_file
from geotrain.cli.output import Output
from geotrain.observe.rundir import RunDirError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="where a run's time went: per site and per rank compute / comm / wait, bytes, plots",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (`geotrain train` prints it at start)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of tables")
    parser.add_argument("--plot", type=plot_file, metavar="FILE.png",
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


MAX_RANKS_SHOWN = 8
"""An incomplete run's line names this many ranks, then counts the rest."""
MAX_RANK_ROWS = 64
"""The per-rank table lists every rank up to this many; above, the ranks that wait most, this many of them (--json
and the plot's per-site spread have every rank)."""
COLUMNS = ["step s", "compute s", "comm s", "wait s", "% c/m/w", "MB intra", "MB inter"]


def run(args: Any) -> int:
    from geotrain.observe.lines import load_lines
    from geotrain.observe.run_report import run_report

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"report: {run_dir}: no such directory")
    if args.tensorboard:  # checked before the work: the package, and a folder it can write
        from geotrain.observe.tensorboard import check_writable

        check_writable(run_dir)
    lines = load_lines(run_dir)
    report = run_report(run_dir, lines)
    if report["split"] is None:
        skipped = f"; {report['skipped_lines']} unreadable lines skipped" if report["skipped_lines"] else ""
        raise RunDirError(f"report: {run_dir}: no step records under metrics/ (did the run reach a step?){skipped}")
    steps, events = lines.steps, lines.events
    about = report["about"]
    if args.plot:
        from geotrain.observe.report import plot_run

        try:
            title = f"{about.get('plan', run_dir.name)} on {about.get('cluster', '?')}"
            plot_run(steps, events, args.plot, title=title)
        except OSError as exc:
            raise RunDirError(f"report --plot {args.plot}: cannot write: {exc.strerror or exc}") from None
    board = None
    if args.tensorboard:
        from geotrain.observe.tensorboard import write_scalars

        board = write_scalars(run_dir, steps)
    out = Output(json_mode=args.json)
    if args.json:
        out.emit_json({**report, "plot": args.plot, "tensorboard": None if board is None else str(board)})
        return 0
    split, unit = report["split"], "emulated" if any(s.get("emulated_end_s") is not None for s in steps) else "wall"
    if not split["steps_used"]:  # an elastic run's lines: loss and step seconds, no compute / comm / wait split
        mean = sum(s["step_s"] for s in steps) / len(steps)
        out.text(f"{len(steps)} step lines of {report['ranks']} ranks, mean {mean:.3f} s a step; "
                 "no compute / comm / wait split in this run's lines (elastic groups do not measure it)")
    else:
        _split_tables(out, split, unit)
    if split["steps_used"] and split.get("asynchronous"):
        out.text("asynchronous outer updates: no rank waits for another's step (its exchange with the global "
                 "model's server is its comm), so no site holds the others back")
    _closing_lines(out, report["holding_back"], report["events"], report["observer_cost"], args.plot, board,
                   ended_early=report["incomplete"] is not None)
    _health_lines(out, report)
    return 0


def _health_lines(out: Output, report: dict[str, Any]) -> None:
    """Whether the run is whole: ranks that did not end normally, lines that could not be read."""
    missing = report["incomplete"]
    if missing is not None:
        ranks = list(missing["ranks"].items())
        shown = "; ".join(f"rank {rank}: {why}" for rank, why in ranks[:MAX_RANKS_SHOWN])
        more = f"; and {len(ranks) - MAX_RANKS_SHOWN} more ranks" if len(ranks) > MAX_RANKS_SHOWN else ""
        out.text(f"incomplete: {len(ranks)} rank{'s' if len(ranks) != 1 else ''} did not end normally ({shown}{more})")
    if report["skipped_lines"]:
        out.text(f"skipped {report['skipped_lines']} unreadable line{'s' if report['skipped_lines'] != 1 else ''}"
                 + (": " + "; ".join(report["notes"]) if report["notes"] else ""))
    elif report["notes"]:  # no line skipped: only notes on the run's files (run.json missing, ...)
        out.text("note: " + "; ".join(report["notes"]))


def _split_tables(out: Output, split: dict[str, Any], unit: str) -> None:
    used = split["steps_used"]
    steps = (f"each rank's own steps after its first ({used[0]}..{used[1]}: ranks took different numbers of steps)"
             if split.get("uneven") else f"steps {used[0]}..{used[1]}")
    out.table(f"per site: mean {unit} seconds per step over {steps}; bytes summed",
              ["site", "ranks", *COLUMNS],
              [[e["site"], " ".join(map(str, e["ranks"])), *row[1:]]
               for e, row in zip(split["sites"], _rows(split["sites"], ["site"]), strict=True)])
    ranks, title = split["ranks"], "per rank"
    if len(ranks) > MAX_RANK_ROWS:
        ranks = sorted(ranks, key=lambda e: -e["wait_s"])[:MAX_RANK_ROWS]
        title = (f"per rank: the {MAX_RANK_ROWS} of {len(split['ranks'])} ranks that wait most (--json lists "
                 "every rank)")
    out.table(title, ["rank", "site", "stage", "replica", *COLUMNS], _rows(ranks, ["rank", "site", "stage", "replica"]))


def _closing_lines(out: Output, slow: Any, counts: dict[str, int], cost: Any, plot: str | None, board: Any,
                   ended_early: bool = False) -> None:
    """The site holding the others back (in a run that ended early: over the steps its ranks completed, which say
    nothing of the step it ended in: the `incomplete` line says why), events, the metrics' cost, the plot."""
    if slow is not None:
        when = "in the steps completed before the run ended (see 'incomplete' below), " if ended_early else ""
        out.text(f"{when}{slow['site']} holds the others back: its ranks wait {slow['wait_pct']:.0f}% of the step and "
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
