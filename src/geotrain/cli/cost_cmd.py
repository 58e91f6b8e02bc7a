"""`geotrain cost`: score a plan file with a cost model.

With --json, stdout is ONE JSON object: {"cost": {"dp", "pp", "total"}, "stages", "replicas",
"dp_per_stage", "pp_per_replica", "cost_model", "layer_shares", "job", "job_from"}; times in seconds per
iteration. The plan's R sets c_pp. A plan with a recorded layer split (`plan --uneven-split`) is scored with
its stage shares by the cost models that see compute ("layer_shares" in the JSON; null otherwise).
The job scored ("job_from"): --job when given, else the job the plan records ("plan"), else the default
("default"). A sharded plan (its "shards": K devices per slot) is scored on its slots (cost/shards.py: K
parallel same-shard exchanges, compute over K devices and FSDP's traffic inside a slot for the models that see
compute); "shards" in the JSON is K (1 without). A plan made for another cluster (its recorded fingerprint) is refused in one line.
"""

from __future__ import annotations

import sys
from typing import Any

from geotrain.cli.help_format import DefaultsHelpFormatter
from geotrain.cli.output import Output
from geotrain.cli.placement_args import (DEFAULT_JOB, add_placement_arguments, assignment_rows, build_placement,
                                         region_legend)
from geotrain.cluster import load_cluster
from geotrain.cost.registry import UNEVEN_SPLIT_MODELS
from geotrain.cost.shards import slot_view
from geotrain.plan import Plan


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cost", help="score a plan file (e.g. one written by `geotrain plan --json`)",
        description="Communication seconds per iteration of a plan on a cluster.",
        formatter_class=DefaultsHelpFormatter)
    add_placement_arguments(parser)
    parser.add_argument("--plan", required=True, metavar="PLAN.json",
                        help='plan file: {"stages", "replicas", "assignment", ...}')
    parser.set_defaults(handler=run, job=None)  # not given: the plan's job, else DEFAULT_JOB


def run(args: Any) -> int:
    out = Output(json_mode=args.json)
    plan = Plan.load(args.plan)
    cluster = load_cluster(args.cluster)
    note = plan.check_cluster(cluster, args.plan, args.cluster)
    if note:
        print(f"geotrain: note: {note}", file=sys.stderr)
    recorded = None if args.job is not None else plan.recorded_job(args.plan)
    job_from = "--job" if args.job is not None else "plan" if recorded is not None else "default"
    if job_from == "default":
        args.job = DEFAULT_JOB
    shares = None if plan.split is None else plan.split.layer_shares
    used = shares is not None and args.cost_model in UNEVEN_SPLIT_MODELS
    assignment = plan.check_fits(cluster.n_devices, args.plan)
    slots, sharding, scored = cluster, None, assignment
    if plan.shards is not None:  # scored on the slot cluster: K devices per slot (cost.shards)
        slots, sharding, scored = slot_view(cluster, plan.check_shard_devices(cluster, args.plan))
    _, job, model = build_placement(args, plan.stages, plan.replicas, layer_shares=shares if used else None,
                                    strict=False, cluster=slots, job=recorded, sharding=sharding)
    cost = model.evaluate(scored)
    if args.json:
        out.emit_json({"cost": cost.to_json(), "stages": plan.stages, "replicas": plan.replicas,
                       "dp_per_stage": cost.dp_per_stage, "pp_per_replica": cost.pp_per_replica,
                       "cost_model": model.name, "shards": plan.k,
                       "layer_shares": shares if used else None, "job": job.name, "job_from": job_from})
        return 0
    whose = {"plan": "the plan's job", "--job": "--job", "default": "the default job; the plan records none"}[job_from]
    out.table(f"cost of {args.plan} on {cluster.name} (job {job.name}: {whose}; {model.name})", ["term", "seconds"],
              [["dp (slowest stage all-reduce)", f"{cost.dp:.3f}"], ["pp (slowest pipeline)", f"{cost.pp:.3f}"],
               *([k, f"{v:.3f}"] for k, v in cost.extra.items()), ["total", f"{cost.total:.3f}"]])
    dp, pp = cost.dp_per_stage, cost.pp_per_replica
    out.table("per stage and per replica", ["index", "stage dp s", "replica pp s"],
              [[i, f"{dp[i]:.3f}" if i < len(dp) else "", f"{pp[i]:.3f}" if i < len(pp) else ""]
               for i in range(max(len(dp), len(pp)))])
    out.table("assignment", ["", *(f"r{r}" for r in range(plan.replicas))], assignment_rows(cluster, assignment))
    out.text(region_legend(cluster))
    if plan.split is not None:
        out.text(f"the plan's layer split {list(plan.split.boundaries)}: "
                 + ("scored with its stage shares" if used else
                    f"not seen by {model.name} (communication only; use one of {', '.join(UNEVEN_SPLIT_MODELS)})"))
    return 0

