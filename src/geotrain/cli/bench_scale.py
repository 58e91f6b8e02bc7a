"""`geotrain bench scale` (also `geotrain bench plan --scale`): devices vs method vs seconds vs
cost vs lower bound vs gap on seeded multi-cloud clusters of 64..1024 devices."""

from __future__ import annotations

import argparse
from typing import Any

from geotrain.bench.scale import BOUND_MODES, FAMILIES
from geotrain.cli.arg_types import positive_float, seed

NAME = "scale"
HELP = "placement at scale: methods on 64..1024-device multi-cloud clusters, with proven lower bounds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="64,128,256,512,1024", help="device counts, comma-separated")
    parser.add_argument("--stages", type=int, default=8, help="pipeline stages S (R = devices / S)")
    parser.add_argument("--jitter", type=float, default=0.1,
                        help="per-pair bandwidth noise (0: region-uniform clusters, where exact may apply)")
    parser.add_argument("--method", action="append", default=None, metavar="NAME", help="method (repeatable)")
    parser.add_argument("--seed", type=seed, default=0, help="cluster and search seed")
    parser.add_argument("--time-limit", type=positive_float, default=30.0, metavar="SEC", help="per-method time limit")
    parser.add_argument("--bound-time-limit", type=positive_float, default=60.0, metavar="SEC",
                        help="lower-bound MILP limit")
    parser.add_argument("--family", default="multicloud", choices=FAMILIES,
                        help="multicloud: 8 equal regions of mixed GPUs (--jitter); uniform / jittered: the same at "
                             "jitter 0 / 0.1; uneven: 4-8 regions of unequal sizes and intra speeds (region-uniform); "
                             "many-region: six regions of 16/12/12/8/8/8 x devices/64 with uneven links")
    parser.add_argument("--bound", default="after", choices=BOUND_MODES,
                        help="after: the methods, then one lower bound for --bound-time-limit; beside: one method "
                             "that reports its plans while it searches (auto), with the bound beside it on another "
                             "core from its first plan, both within --time-limit (as plan --lower-bound "
                             "--time-limit does on two or more cores)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def run(args: Any) -> int:
    from geotrain.bench.scale import DEFAULT_METHODS, ScaleBenchConfig, rows_to_json, run_scale_bench
    from geotrain.cli.output import Output
    from geotrain.errors import GeotrainError, shown

    try:
        sizes = tuple(int(v) for v in str(args.sizes).split(",") if v.strip())
    except ValueError:
        raise GeotrainError(f"--sizes must be comma-separated integers, got {shown(args.sizes)}") from None
    out = Output(json_mode=args.json)
    config = ScaleBenchConfig(sizes=sizes, stages=args.stages, jitter=args.jitter, seed=args.seed,
                              methods=tuple(args.method) if args.method else
                              ("auto",) if args.bound == "beside" else DEFAULT_METHODS,
                              time_limit_s=args.time_limit, bound_time_limit_s=args.bound_time_limit,
                              family=args.family, bound=args.bound)
    with out.progress("bench scale", 1) as progress:
        rows = run_scale_bench(config, progress)
    if args.json:
        out.emit_json(rows_to_json(config, rows))
        return 0

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    family = {"multicloud": f"multicloud, 8 regions, jitter {config.jitter}", "uniform": "multicloud, jitter 0",
              "jittered": "multicloud, jitter 0.1", "uneven": "uneven regions (4-8, unequal sizes and intra speeds)",
              "many-region": "six uneven regions (16/12/12/8/8/8 x devices/64)"}[config.family]
    out.table(f"placement at scale: {family}, {config.stages} stages, time limit {config.time_limit_s:g} s per method",
              ["devices", "cluster", "S x R", "method", "seconds", "wall / limit s", "total s", "lower bound s", "gap",
               "bound from"],
              [[str(r.devices), r.cluster, f"{r.stages}x{r.replicas}", r.method, num(r.seconds, ".1f"),
                f"{r.wall_s:.0f} / {r.limit_s:.0f}", num(r.total_s, ".3f"),
                f"{r.lower_bound_s:.3f}", "-" if r.gap is None else f"{100 * r.gap:.1f}%",
                r.bound_source if not r.note else f"n/a: {r.note}"] for r in rows], right_align_from=4)
    return 0
