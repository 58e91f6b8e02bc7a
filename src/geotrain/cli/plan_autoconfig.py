"""`geotrain plan` without --stages/--replicas: auto-configuration (search.autoconfig).

With --json, stdout is ONE JSON object: the chosen plan in the `plan --json` form ("method":
"auto-config", "stages", "replicas", "assignment", "cost": {"dp", "pp", "compute", "total"},
"seconds") plus "microbatches", "devices_used", "memory_per_device_bytes", "lower_bound", "gap",
"tokens_per_s" and "candidates": [the same facts for each of the best configurations, chosen first].
`geotrain cost --plan` reads it as it is. Configurations are screened with "yuan+compute" and the
finalists ranked with the event-simulated "schedule" model, unless --cost-model yuan+compute; each
with the better of the equal and the speed layer split (then the JSON has the plan's "split" object,
which `geotrain train --plan` cuts the model at).
"""

from __future__ import annotations

import argparse
from typing import Any

from geotrain.cli.output import Output, write_json_file
from geotrain.cluster import load_cluster
from geotrain.cost.memory import MODELLED_SCHEDULES, MemoryConfig
from geotrain.errors import GeotrainError
from geotrain.job import load_job
from geotrain.plan import Plan, cluster_record, job_record
from geotrain.search.autoconfig import AutoConfigOptions, auto_configure


def add_autoconfig_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("auto-configuration (no --stages/--replicas)")
    group.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3),
                       help="ZeRO-style sharding over each DP group: 1 optimizer state, 2 + gradients, 3 + weights")
    group.add_argument("--recompute", action="store_true", help="full activation checkpointing (less memory)")
    group.add_argument("--schedule", default="1f1b", choices=MODELLED_SCHEDULES,
                       help="pipeline schedule: sets the micro-batches whose activations are in flight")
    group.add_argument("--top", type=int, default=5, help="configurations to report")


def run_autoconfig(args: Any, out: Output) -> int:
    cluster = load_cluster(args.cluster)
    job = load_job(args.job)
    if args.top < 1:
        raise GeotrainError(f"--top must be >= 1, got {args.top}")
    rank_model = "yuan+compute" if args.cost_model == "yuan+compute" else "schedule"
    if args.lower_bound or args.method != "auto":
        raise GeotrainError("--method and --lower-bound apply to a fixed layout: give --stages and --replicas "
                            "(auto-configuration places with its own heuristics and reports each layout's bound)")
    limit = {} if args.time_limit is None else {"refine_time_limit_s": max(0.0, float(args.time_limit))}
    options = AutoConfigOptions(memory=MemoryConfig(zero=args.zero, recompute=args.recompute, schedule=args.schedule),
                                top=args.top, rank_model=rank_model, **limit)
    with out.progress(f"auto-configuring {job.name} on {cluster.name}", 1):
        result = auto_configure(cluster, job, options, seed=args.seed)
    rows = [candidate.to_json(job) for candidate in result.candidates]
    chosen = rows[0]
    doc = {"method": "auto-config", **{k: v for k, v in chosen.items() if k != "placement"},
           "seconds": result.seconds, "placement": chosen["placement"], "candidates": rows,
           "layouts_scored": result.layouts_scored, "layouts_pruned": result.layouts_pruned,
           "memory": {"zero": args.zero, "recompute": args.recompute, "schedule": args.schedule},
           "seed": args.seed, **cluster_record(cluster), **job_record(job), "cost_model": rank_model}
    plan = Plan.from_json(doc, "auto-config")  # the chosen layout, with every candidate recorded in plan.extra
    if args.out:
        write_json_file(plan.to_json(), args.out)
    if args.json:
        out.emit_json(plan.to_json())
        return 0
    table = [[str(r["stages"]), str(r["replicas"]), str(r["microbatches"]), f"{r['devices_used']}/{cluster.n_devices}",
              f"{r['iteration_s']:.3f}", f"{r['tokens_per_s']:,.0f}", f"{r['memory_per_device_bytes'] / 1e9:.1f}",
              f"{r['lower_bound']:.3f}", f"{100 * r['gap']:.1f}%"] for r in rows]
    out.table(f"auto-configuration: {job.name} on {cluster.name} ({rank_model}, {args.schedule}, zero={args.zero})",
              ["S", "R", "M", "devices", "iteration s", "tokens/s", "peak GB/device", "bound s", "gap"],
              table, right_align_from=0)
    out.text(f"chosen: {chosen['stages']} stages x {chosen['replicas']} replicas, {chosen['microbatches']} micro-batches "
             f"on {chosen['devices_used']} of {cluster.n_devices} devices ({chosen['placement']} placement); "
             f"{result.layouts_scored} layouts scored, {result.layouts_pruned} pruned by their bound, "
             f"{result.seconds:.1f} s")
    if args.out:
        out.text(f"plan written to {args.out}")
    return 0
