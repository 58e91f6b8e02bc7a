"""`geotrain emulate`: run an unmodified torch.distributed script on one process per emulated device.

    geotrain emulate --cluster C (--plan P | --devices 0,5,9) [--time-scale F] [--report F.json] -- SCRIPT.py [ARGS]
    geotrain emulate --cluster C --devices 0,1 -m package.module [ARGS]
    geotrain emulate --cluster C --plan P --emulate-gpu-speed -- SCRIPT.py   # compute at each GPU's speed
    geotrain emulate ... --trace F.json -- SCRIPT.py   (a Chrome trace: Perfetto, chrome://tracing)

Rank i emulates devices[i]; with --plan, rank s*R + r emulates assignment[s][r]. The script's
`dist.init_process_group("gloo")` (or with no backend) gets the emulating backend. Exit code: the worst
rank's (124 on --timeout, 900 s by default).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from geotrain.cli.arg_types import bandwidth_gbps, output_file, positive_float
from geotrain.cli.help_format import DefaultsHelpFormatter
from geotrain.cluster import load_cluster
from geotrain.errors import shown
from geotrain.cli.device_args import rank_devices

DEFAULT_TIMEOUT_S = 900.0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "emulate", help="run a torch.distributed script as if on the cluster's links (one process per device)",
        description=__doc__.split("\n\n")[0], formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--cluster", required=True, help="cluster preset or YAML/JSON file")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--plan", metavar="PLAN.json", help="rank s*R + r emulates assignment[s][r]")
    which.add_argument("--devices", metavar="D0,D1,...", help="rank i emulates device D_i")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="wall seconds slept per emulated second of link time (0: no sleeping)")
    parser.add_argument("--nic-gbps", type=bandwidth_gbps, default=None,
                        help="every device's uplink in Gbit/s, shared by its concurrent sends (default: the cluster "
                             "file's nic_gbps, unlimited where none is given)")
    parser.add_argument("--emulate-gpu-speed", action="store_true",
                        help="emulated compute runs at each device's GPU speed: a rank's measured compute x (the "
                             "cluster's fastest GPU's peak FLOP/s / its device's); the fastest computes at this "
                             "machine's speed (emulated time only: the report's clocks and the links' schedule)")
    parser.add_argument("--compute-clock", choices=("wall", "cpu"), default="wall",
                        help="how a rank's emulated clock counts compute: wall seconds (this machine's load and "
                             "shared cores included) or the rank's CPU seconds (as if each rank had a core to itself)")
    parser.add_argument("--report", type=output_file, metavar="FILE.json", help="write every transfer and collective as JSON")
    parser.add_argument("--trace", type=output_file, metavar="FILE.json",
                        help="write a timeline in the Chrome trace event format (Perfetto, chrome://tracing): one "
                             "process per rank, every transfer and collective of the report at its emulated times")
    parser.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="SEC",
                        help="stop all ranks (SIGTERM, then SIGKILL) after SEC wall seconds and exit 124; the "
                             "default bounds a hung rank well below gloo's own 30-minute collective timeout")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module (as python -m) instead of a script")
    parser.add_argument("target", nargs=argparse.REMAINDER, help="-- SCRIPT.py [ARGS...] (or the module's ARGS)")
    parser.set_defaults(handler=run)


def target_of(args: Any) -> tuple[str, ...]:
    from geotrain.emulate.network import EmulationError

    rest = list(args.target)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.module:
        if not module_found(args.module):
            raise EmulationError(f"emulate -m {shown(args.module)}: no such module (as `python -m` would look for it "
                                 "from this directory and PYTHONPATH)")
        return ("-m", args.module, *rest)
    if not rest:
        raise EmulationError("emulate: name the script to run after `--` (or give -m MODULE)")
    if not Path(rest[0]).is_file():
        raise EmulationError(f"emulate: script {rest[0]!r:.80}: no such file")
    return tuple(rest)


def module_found(name: str) -> bool:
    """Whether `python -m name` started here finds the module, without running any of it: the top-level name
    on this directory, the ranks' PYTHONPATH (the environment they inherit) and sys.path, or a built-in one; each
    further part in its package's folders (no __init__ is executed)."""
    import importlib.util
    from importlib.machinery import PathFinder

    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return False
    extra = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    try:
        spec = PathFinder.find_spec(parts[0], [os.getcwd(), *extra, *sys.path]) or importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        spec = None
    for part in parts[1:]:
        if spec is None or spec.submodule_search_locations is None:
            return False
        spec = PathFinder.find_spec(part, list(spec.submodule_search_locations))
    return spec is not None


def same_file(first: str, second: str) -> bool:
    """Whether two output paths name one file (through symbolic links, hard links and relative parts too)."""
    if os.path.realpath(first) == os.path.realpath(second):
        return True
    try:
        return os.path.samefile(first, second)  # two names of one existing file (a hard link)
    except OSError:  # one of them does not exist yet: two files
        return False


def gpu_compute_scale(cluster: Any) -> tuple[float, ...]:
    """--emulate-gpu-speed: each device's slowdown against the cluster's fastest GPU (cost.device_slowdowns)."""
    from geotrain.cost import UnknownGpuError, device_slowdowns
    from geotrain.emulate.network import EmulationError

    try:
        return tuple(float(k) for k in device_slowdowns(cluster))
    except UnknownGpuError as exc:
        raise EmulationError(f"emulate --emulate-gpu-speed on cluster {cluster.name!r}: {exc}") from None


def run(args: Any) -> int:
    from geotrain.emulate.launch import LaunchConfig, launch  # torch: imported only when emulating
    from geotrain.cluster.devices import check_device_list

    if args.trace and args.report and same_file(args.trace, args.report):
        from geotrain.emulate.network import EmulationError

        raise EmulationError(f"emulate: --trace and --report name the same file {shown(args.report)}: the trace "
                             "would overwrite the report; give two paths")
    cluster = load_cluster(args.cluster)
    ranks = rank_devices(args.plan, args.devices, cluster.n_devices)  # one of the two is required
    devices = check_device_list(ranks, cluster.n_devices)
    import contextlib
    import tempfile

    from geotrain.procs.rundir import current_run_dir

    # --trace alone needs the report too: in the run directory, which goes with the run even after a SIGKILL
    scratch = (tempfile.TemporaryDirectory(prefix="geotrain-trace-", dir=current_run_dir())
               if args.trace and not args.report else contextlib.nullcontext(None))
    with scratch as tmp:
        report_path = Path(args.report) if args.report else Path(tmp) / "report.json" if args.trace else None
        config = LaunchConfig(target_of(args), args.time_scale, args.nic_gbps, report_path, args.timeout,
                              compute_scale=gpu_compute_scale(cluster) if args.emulate_gpu_speed else None,
                              compute_clock=args.compute_clock)
        result = launch(cluster, devices, config)
    if args.trace and result.report is not None:
        from geotrain.observe.trace import build_trace, write_trace

        write_trace(args.trace, build_trace(result.report, rank_names={
            rank: f"rank {rank} ({cluster.device_names[device]})" for rank, device in enumerate(devices)}))
    status = "timed out" if result.timed_out else f"exit codes {list(result.rank_codes)}"
    line = f"geotrain emulate: {len(devices)} ranks on {cluster.name}, {status}"
    if not result.verdict.ok:
        line += f" ({result.verdict.message})"
    if result.report is not None:
        summary = result.report["summary"]
        peaks = summary["peak_inter_region_gbps_by_window"]
        line += (f"; {summary['transfers']} transfers, {summary['bytes'] / 1e6:.3f} MB "
                 f"({summary['inter_region_bytes'] / 1e6:.3f} MB between regions), "
                 f"peak between regions {peaks['1']:.3f} Gbit/s over 1 s, {peaks['0.1']:.3f} over 0.1 s, "
                 f"emulated {summary['emulated_end_s']:.3f} s"
                 + (f"; report {args.report}" if args.report else "") + (f"; trace {args.trace}" if args.trace else ""))
    print(line, file=sys.stderr)
    return result.exit_code
