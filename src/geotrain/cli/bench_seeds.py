"""`geotrain bench seeds`: placement methods over several seeds against the proven optimum (exact)
or, where exact does not apply, a proven lower bound."""

from __future__ import annotations

import argparse
from typing import Any

from geotrain.cli.arg_types import count

from geotrain.cli.arg_types import positive_float

NAME = "seeds"
HELP = "placement methods over several seeds: worst and median gap to the proven optimum or lower bound"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", default="seed-geo", metavar="FILE|PRESET", help="cluster preset or file")
    parser.add_argument("--job", default="gpt-1.3b-seed", metavar="PRESET|FILE", help="job preset or file")
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages S")
    parser.add_argument("--replicas", type=int, default=8, help="data-parallel replicas R")
    parser.add_argument("--seeds", type=count, default=5, help="seeds 0..N-1 for every seeded method")
    parser.add_argument("--time-limit", type=positive_float, default=60.0, metavar="SEC", help="per-run time limit")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def run(args: Any) -> int:
    from geotrain.bench.placement import SeedsBenchConfig, run_seeds_bench
    from geotrain.cli.output import Output

    out = Output(json_mode=args.json)
    config = SeedsBenchConfig(cluster=args.cluster, job=args.job, stages=args.stages, replicas=args.replicas,
                              seeds=tuple(range(args.seeds)), time_limit_s=args.time_limit)
    with out.progress("bench seeds", 1) as progress:
        bench = run_seeds_bench(config, progress)
    if args.json:
        out.emit_json(bench.to_json())
        return 0
    ref = bench.reference
    rows = []
    for row in bench.rows:
        totals = sorted(r["total_s"] for r in row["runs"])
        gaps = [r["gap"] for r in row["runs"]]
        rows.append([row["label"], str(len(totals)), f"{totals[0]:.3f}", f"{totals[len(totals) // 2]:.3f}",
                     f"{totals[-1]:.3f}", f"{100 * max(gaps):.2f}%", f"{sum(g <= 0.01 for g in gaps)}/{len(gaps)}",
                     f"{max(r['seconds'] for r in row['runs']):.2f}"])
    rows.append([f"{ref['kind']} ({ref['source']})", "-", f"{ref['total_s']:.3f}", "", "", "", "", f"{ref['seconds']:.2f}"])
    out.table(f"{config.cluster}, {config.stages} stages x {config.replicas} replicas, job {config.job}: "
              f"gap = (total - {ref['kind']}) / total",
              ["method", "seeds", "best s", "median s", "worst s", "worst gap", "within 1%", "max seconds"], rows)
    return 0
