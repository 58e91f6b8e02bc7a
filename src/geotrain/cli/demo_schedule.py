"""`geotrain demo schedule`: the seed's demo 1 (task placement on a geo-distributed cluster) as tables."""

from __future__ import annotations

import argparse
from typing import Any

from geotrain.cli.arg_types import output_file, seed

NAME = "schedule"
HELP = "seed demo 1: random vs region plans vs local search on 4 regions x 8 GPUs, against one datacenter"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=seed, default=0, help="seed of the random placements and local searches")
    parser.add_argument("--cluster", default="seed-geo", metavar="FILE|PRESET", help="the geo-distributed cluster")
    parser.add_argument("--datacenter", default="seed-datacenter", metavar="FILE|PRESET", help="the baseline cluster")
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages S")
    parser.add_argument("--replicas", type=int, default=8, help="data-parallel replicas R")
    parser.add_argument("--plot", default=None, type=output_file, metavar="FILE", help="write a PNG of the best plan to FILE")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def run(args: Any) -> int:
    from geotrain.cli.output import Output
    from geotrain.demos.schedule import ScheduleDemoConfig, run_schedule_demo

    out = Output(json_mode=args.json)
    config = ScheduleDemoConfig(cluster=args.cluster, datacenter=args.datacenter, stages=args.stages,
                                replicas=args.replicas, seed=args.seed)
    with out.progress("demo 1: placement searches", 1) as progress:
        demo = run_schedule_demo(config, progress)
    if args.plot:
        from geotrain.cluster import load_cluster
        from geotrain.plots import plot_placement

        best = demo.best
        plot_placement(load_cluster(config.cluster), best["assignment"], args.plot,
                       f"{config.cluster}: best plan ({best['method']}), {best['total_s']:.1f} s communication "
                       f"(dp {best['dp_s']:.1f} + pp {best['pp_s']:.1f})")
    if args.json:
        out.emit_json({**demo.to_json(), "plot": args.plot})
        return 0
    dc = demo.datacenter
    out.text(f"Demo 1: {config.stages} stages x {config.replicas} replicas of {config.job} on {config.cluster} "
             f"(communication seconds per iteration, cost model {config.cost_model})")
    rows = [[row.label, f"{row.total_s:.1f}", f"{row.ratio:.1f}",
             "" if row.dp_s is None else f"{row.dp_s:.1f}", "" if row.pp_s is None else f"{row.pp_s:.1f}",
             f"{row.wall_s:.2f}"] for row in demo.rows]
    rows.append([f"datacenter ({config.datacenter})", f"{dc['total_s']:.2f}", "1.0",
                 f"{dc['dp_s']:.2f}", f"{dc['pp_s']:.2f}", ""])
    out.table(None, ["placement", "seconds", "x dc", "dp s", "pp s", "search s"], rows)
    out.text("pipeline-local: whole pipelines inside a region, DP across regions; dp-local: each stage's DP group "
             "inside a region, pipelines across; local search: best of restarts x swaps")
    restarts = demo.per_restart_s
    out.text("per-restart results: strict " + ", ".join(f"{x:.1f}" for x in restarts["strict"])
             + "; sideways " + ", ".join(f"{x:.1f}" for x in restarts["sideways"]) + " (s)")
    loc, comp, best = demo.locality["best"], demo.compute, demo.best
    out.text(f"best plan ({best['method']}): dp {best['dp_s']:.1f} s + pp {best['pp_s']:.1f} s = {best['total_s']:.1f} s; "
             f"{loc['pipeline_edges_in_region']} of {loc['pipeline_edges']} pipeline edges and "
             f"{loc['dp_groups_in_region']} of {loc['dp_groups']} DP groups inside one region")
    out.text(f"with compute ({comp['flops']:.2e} FLOPs on {config.stages * config.replicas} GPUs at 40% of 125 TFLOP/s "
             f"-> {comp['compute_s']:.1f} s), no overlap: datacenter {comp['datacenter_s']:.1f} s, geo + local search "
             f"{comp['geo_best_s']:.1f} s ({comp['slowdown_best']:.1f}x); random placement "
             f"{comp['slowdown_random_mean']:.1f}x")
    out.text("\nObservations (from this run's numbers):")
    for i, line in enumerate(demo.observations, 1):
        out.text(f" {i}. {line}")
    if args.plot:
        out.text(f"\nplot written to {args.plot}")
    return 0
