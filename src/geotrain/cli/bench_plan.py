"""`geotrain bench plan`: placement methods side by side, and swap evaluations per second."""

from __future__ import annotations

import argparse
from typing import Any

from geotrain.cli.arg_types import positive_float, seed

NAME = "plan"
HELP = "placement search: cost, gap to best, wall time per method; incremental vs full swap evaluation speed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", default="seed-geo", metavar="FILE|PRESET", help="cluster preset or file")
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages S")
    parser.add_argument("--replicas", type=int, default=8, help="data-parallel replicas R")
    parser.add_argument("--seed", type=seed, default=0, help="seed of every search and of the swap walk")
    parser.add_argument("--method", action="append", default=None, metavar="NAME",
                        help="only rows of this method (repeatable); default: the seed's runs and every other method")
    parser.add_argument("--time-limit", type=positive_float, default=120.0, metavar="SEC", help="per-method time limit")
    parser.add_argument("--swaps", type=int, default=400_000, help="swaps timed for the incremental evaluator")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--scale", action="store_true",
                        help="run `geotrain bench scale` (its defaults) instead: methods and lower bounds at 64..1024 devices")


def run(args: Any) -> int:
    if args.scale:
        from geotrain.cli import bench_scale

        scale_args = argparse.ArgumentParser(allow_abbrev=False)
        bench_scale.add_arguments(scale_args)
        return bench_scale.run(scale_args.parse_args(["--json"] if args.json else []))
    from geotrain.bench.plan import PlanBenchConfig, run_plan_bench
    from geotrain.cli.output import Output

    out = Output(json_mode=args.json)
    config = PlanBenchConfig(cluster=args.cluster, stages=args.stages, replicas=args.replicas, seed=args.seed,
                             methods=tuple(args.method) if args.method else None, time_limit_s=args.time_limit,
                             incremental_swaps=args.swaps, compiled_full_swaps=max(1, args.swaps // 4))
    with out.progress("bench plan: searches", 1) as progress:
        bench = run_plan_bench(config, progress)
    if args.json:
        out.emit_json(bench.to_json())
        return 0
    out.table(f"placement methods on {config.cluster}, {config.stages} stages x {config.replicas} replicas "
              f"(seed {config.seed})", ["method", "total s", "gap", "dp s", "pp s", "wall s", "evaluations"],
              [[row["label"], f"{row['total_s']:.3f}", f"{100 * row['gap']:.1f}%", f"{row['dp_s']:.2f}",
                f"{row['pp_s']:.2f}", f"{row['wall_s']:.3f}", f"{row['evaluations']:,}"] for row in bench.rows])
    speed = bench.swap_speed
    names = {"incremental": "incremental (numba)", "compiled_full": "full (numba)", "numpy_full": "full (evaluate_many)"}
    out.table(f"swap evaluations per second, {speed['devices']} devices, same walk, best of 3",
              ["evaluator", "swaps", "seconds", "evals/s", "incr. is"],
              [[names[key], f"{speed['swaps'][key]:,}", f"{speed['seconds'][key]:.3f}",
                f"{speed['evals_per_s'][key]:,.0f}",
                "-" if key == "incremental" else f"{speed['evals_per_s']['incremental'] / speed['evals_per_s'][key]:.1f}x"]
               for key in names])
    out.text("incremental: O(R+S) per swap (touched groups and replicas); full: O(S R^2) per swap. "
             f"Walks agree (same accepted swaps, same end total): {speed['walks_agree']}")
    return 0
