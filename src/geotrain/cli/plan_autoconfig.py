"""`geotrain plan` without --stages/--replicas: auto-configuration (search.autoconfig).

With --json, stdout is ONE JSON object: the chosen plan in the `plan --json` form ("method":
"auto-config", "stages", "replicas", "assignment", "cost": {"dp", "pp", "compute", "total"},
"seconds") plus "microbatches", "devices_used", "memory_per_device_bytes", "lower_bound", "gap",
"tokens_per_s" and "candidates": [the same facts for each of the best configurations, chosen first].
`geotrain cost --plan` reads it as it is. Configurations are screened with "yuan+compute" and the
finalists ranked with the event-simulated "schedule" model, unless --cost-model yuan+compute; each
with the better of the equal and the speed layer split (then the JSON has the plan's "split" object,
which `geotrain train --plan` cuts the model at).

With --wan-recipe auto the layout and the recipe are chosen together: layouts are screened with the DP exchange
every H steps (H the largest the recipe may choose: search.autoconfig's sync_period), each device holding the outer
sync's state too (anchor, momentum, residual: cost.memory.RECIPE_OUTER_BYTES_PER_PARAM; none with --outer-state host:
host memory holds it), then every candidate is given its recipe
(cli/plan_recipe.py: the same rule as a fixed layout's) and they are ranked by the recipe's step charged for
staleness; each candidate row adds "recipe": {"scheme", "step_s", "charged_s"}, and the plan the chosen one's
"wan_recipe" (or "batch_shares") as a fixed layout's does. Every plan adds "explanation": sentences naming the
choice, the next options with their predicted times, and the binding constraint (cli/plan_explain.py).

Sharded replicas: where no layout fits one device per (stage, replica) slot (or with --shards K), slots of K
devices of one site holding FSDP2 shards are searched (search.autoconfig, cost.shards); the plan and each
candidate row then hold "shards" {"k", "gathers_per_step", "devices"}, "devices_used" counts every device, the
table's "K" column says K, and the peak memory is per device of a slot.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from geotrain.cli.output import Output, write_json_file
from geotrain.cli.plan_explain import Option, explain_choice
from geotrain.cli.plan_money import check_objective, money_line, plan_money, sharded_plan_money
from geotrain.cli.plan_recipe import (PricedRecipe, calibration_of, device_outer_bytes_per_param, largest_sync_every,
                                      outer_state_document, price_recipe, recipe_documents, recipe_tables)
from geotrain.cluster import Cluster, load_cluster
from geotrain.cost.memory import MODELLED_SCHEDULES, MemoryConfig
from geotrain.cost.money import StepMoney
from geotrain.cost.shards import slot_view
from geotrain.cost.yuan import YuanCostModel
from geotrain.errors import GeotrainError
from geotrain.job import Job, load_job
from geotrain.plan import Plan, cluster_record, job_record
from geotrain.search.autoconfig import AutoConfigOptions, Candidate, auto_configure

RECIPE_CANDIDATES = 40
"""With --wan-recipe auto: configurations the screen passes on (at least --top); the best micro-batching of each
(S, R) among them is given a recipe and ranked by it."""


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
    check_objective(args, cluster, fixed_layout=False)
    job = load_job(args.job)
    calibration = calibration_of(args, job)
    if args.top < 1:
        raise GeotrainError(f"--top must be >= 1, got {args.top}")
    rank_model = "yuan+compute" if args.cost_model == "yuan+compute" else "schedule"
    if args.lower_bound or args.method != "auto":
        raise GeotrainError("--method and --lower-bound apply to a fixed layout: give --stages and --replicas "
                            "(auto-configuration places with its own heuristics and reports each layout's bound)")
    limit = {} if args.time_limit is None else {"refine_time_limit_s": max(0.0, float(args.time_limit))}
    recipe = args.wan_recipe == "auto"
    if recipe and args.zero:
        raise GeotrainError("--zero shards the optimizer state across each DP group, which a WAN recipe "
                            "synchronises only every H steps: use --zero 0 with --wan-recipe auto")
    outer_state = outer_state_document(args)  # host: the outer sync's state is not the devices' (plan_recipe)
    state = MemoryConfig().state_bytes_per_param + device_outer_bytes_per_param(recipe, args.outer_state)
    memory = MemoryConfig(state_bytes_per_param=state, zero=args.zero, recompute=args.recompute, schedule=args.schedule)
    options = AutoConfigOptions(memory=memory, top=max(args.top, RECIPE_CANDIDATES) if recipe else args.top,
                                shards=args.shards or 0,
                                rank_model=rank_model, sync_period=largest_sync_every(args.recipe_steps) if recipe else 1,
                                **({"utilisation": args.utilisation} if args.utilisation is not None else {}), **limit)
    with out.progress(f"auto-configuring {job.name} on {cluster.name}", 1):
        result = auto_configure(cluster, job, options, seed=args.seed)
    candidates = result.candidates
    priced: list[PricedRecipe | None] = [None] * len(candidates)
    if recipe:  # one row per layout: the micro-batching changes memory and the pipeline, not the recipe
        layouts = {(c.stages, c.replicas) for c in candidates}
        candidates = [next(c for c in candidates if (c.stages, c.replicas) == key) for key in sorted(
            layouts, key=lambda key: min(c.iteration_s for c in candidates if (c.stages, c.replicas) == key))]
        with out.progress("pricing a WAN recipe for each layout", len(candidates)) as progress:
            priced = []
            for done, candidate in enumerate(candidates, start=1):
                priced.append(candidate_recipe(args, cluster, job, candidate))
                progress(done, len(candidates))
    money = [None if cluster.prices is None else
             (plan_money if c.shard_devices is None else sharded_plan_money)(
                 cluster, job, c.assignment if c.shard_devices is None else c.shard_devices,
                 rank_seconds(c, p) if p is None else p.step_s, p)
             for c, p in zip(candidates, priced)]
    if recipe or args.objective == "cost":
        def key(i: int) -> float:
            if args.objective == "time":
                return rank_seconds(candidates[i], priced[i])
            return progress_usd(money[i], candidates[i], priced[i])
        order = sorted(range(len(candidates)), key=key)[: args.top]
        candidates, priced, money = ([items[i] for i in order] for items in (candidates, priced, money))
    rows = [candidate.to_json(job) for candidate in candidates]
    for row, m in zip(rows, money):
        if m is not None:
            row["money"] = m.to_json(cluster.region_names, args.recipe_steps)
    for row, candidate, p in zip(rows, candidates, priced):
        row["recipe"] = ({"scheme": "one replica", "step_s": candidate.iteration_s, "charged_s": candidate.iteration_s}
                         if p is None else {"scheme": p.chosen, "step_s": p.step_s, "charged_s": p.charged_s})
    options_ = [option_of(c, p) for c, p in zip(candidates, priced)]
    if money[0] is not None:  # USD for a step's progress: per step x the recipe's staleness charge
        options_ = [replace(o, usd=progress_usd(m, c, p)) for o, m, c, p in zip(options_, money, candidates, priced)]
    explanation = explain_choice(cluster, options_, by_cost=args.objective == "cost")
    if money[0] is not None:
        explanation.append(money_line(money[0], args.recipe_steps))
    chosen = rows[0]
    doc = {"method": "auto-config", **{k: v for k, v in chosen.items() if k != "placement"},
           "seconds": result.seconds, "placement": chosen["placement"], "candidates": rows,
           "layouts_scored": result.layouts_scored, "layouts_pruned": result.layouts_pruned,
           "memory": {"zero": args.zero, "recompute": args.recompute, "schedule": args.schedule},
           "seed": args.seed, **cluster_record(cluster), **job_record(job), "cost_model": rank_model,
           **({"sync_period_screened": options.sync_period} if recipe else {}),
           **({"calibration": calibration} if calibration else {}),
           "objective": args.objective,
           **(recipe_documents(cluster, candidates[0].assignment, priced[0]) if recipe and priced[0] else {}),
           **outer_state,
           "explanation": explanation}
    plan = Plan.from_json(doc, "auto-config")  # the chosen layout, with every candidate recorded in plan.extra
    if args.out:
        write_json_file(plan.to_json(), args.out)
    if args.json:
        out.emit_json(plan.to_json())
        return 0
    table = [[str(r["stages"]), str(r["replicas"]), str(r.get("shards", {}).get("k", 1)), str(r["microbatches"]),
              f"{r['devices_used']}/{cluster.n_devices}",
              f"{r['iteration_s']:.3f}", f"{r['tokens_per_s']:,.0f}", f"{r['memory_per_device_bytes'] / 1e9:.1f}",
              f"{r['lower_bound']:.3f}", f"{100 * r['gap']:.1f}%",
              *([r["recipe"]["scheme"], f"{r['recipe']['step_s']:.3f}", f"{r['recipe']['charged_s']:.3f}"]
                if recipe else []),
              *([f"{r['money']['usd_per_step']:.4g}"] if "money" in r else [])] for r in rows]
    screened = f", DP every {options.sync_period} steps" if recipe else ""
    out.table(f"auto-configuration: {job.name} on {cluster.name} ({rank_model}{screened}, {args.schedule}, "
              f"zero={args.zero})",
              ["S", "R", "K", "M", "devices", "iteration s", "tokens/s", "peak GB/device", "bound s", "gap",
               *(["scheme", "recipe step s", "charged s"] if recipe else []),
               *(["USD/step"] if money[0] is not None else [])],
              table, right_align_from=0)
    if recipe and priced[0] is not None:
        recipe_tables(out, cluster, candidates[0].assignment, priced[0])
    shards = f" x {candidates[0].k} shards (FSDP2 in a site)" if candidates[0].k > 1 else ""
    out.text(f"chosen: {chosen['stages']} stages x {chosen['replicas']} replicas{shards}, "
             f"{chosen['microbatches']} micro-batches "
             f"on {chosen['devices_used']} of {cluster.n_devices} devices ({chosen['placement']} placement); "
             f"{result.layouts_scored} layouts scored, {result.layouts_pruned} pruned by their bound, "
             f"{result.seconds:.1f} s")
    for line in explanation:
        out.text(line)
    if args.out:
        out.text(f"plan written to {args.out}")
    return 0


def candidate_recipe(args: Any, cluster: Cluster, job: Job, candidate: Candidate) -> PricedRecipe | None:
    """The WAN recipe of an auto-configured layout (plan_recipe.price_recipe; None for one replica: nothing to
    synchronise): its per-step DP seconds by "yuan" (the recipe's own pricing model), its compute the ranking
    model's (with "schedule", the simulated pipeline, transfers included: pipeline seconds 0 beside it)."""
    if candidate.replicas < 2:
        return None
    assignment = candidate.assignment
    if candidate.shard_devices is not None:  # priced on its slots: K parallel same-shard exchanges (cost.shards)
        cluster, _, assignment = slot_view(cluster, candidate.shard_devices)
    cost = YuanCostModel.for_job(cluster, job, candidate.stages, candidate.replicas).evaluate(assignment)
    pp_s = 0.0 if candidate.model == "schedule" else cost.pp
    return price_recipe(args, cluster, job, assignment, cost.dp, pp_s, compute_s=candidate.compute_s,
                        utilisation=args.utilisation)


def rank_seconds(candidate: Candidate, priced: PricedRecipe | None) -> float:
    """What layouts rank by with --wan-recipe auto: the recipe's charged step, or the iteration (one replica)."""
    return candidate.iteration_s if priced is None else priced.charged_s


def progress_usd(money: StepMoney, candidate: Candidate, priced: PricedRecipe | None) -> float:
    """USD for a step's progress (what --objective cost ranks by): USD per step x the recipe's charge (its time to
    target per step over its step; 1 without a recipe)."""
    step = candidate.iteration_s if priced is None else priced.step_s
    return money.usd * rank_seconds(candidate, priced) / step


def option_of(candidate: Candidate, priced: PricedRecipe | None) -> Option:
    """The explanation's view of a candidate: ranked by its recipe's charged step, or by its iteration."""
    label = f"{candidate.stages} x {candidate.replicas}" + (f" x {candidate.k} shards" if candidate.k > 1 else "")
    devices = candidate.assignment if candidate.shard_devices is None else candidate.shard_devices
    if priced is None:
        scheme = "one replica" if candidate.replicas < 2 else "per-step data parallelism"
        return Option(label, devices, candidate.iteration_s, candidate.compute_s,
                      candidate.memory_per_device_bytes, scheme)
    return Option(label, devices, priced.step_s, priced.busiest_compute_s, candidate.memory_per_device_bytes,
                  priced.scheme, rank_s=priced.charged_s)
