"""`geotrain plan`: search a placement of S stages x R replicas on a cluster.

With --json, stdout is ONE JSON object (DESIGN.md's contract):
{"method", "stages", "replicas", "assignment", "cost": {"dp", "pp", "total"}, "seconds", ...}
plus "evaluations", "options", "seed", "cluster", "job", "global_batch" (the job's, rounded to a multiple
of R where it was not one), "cost_model" (and "lower_bound", "gap"
when the method proves a bound). `geotrain cost --plan` reads that object as it is.
With --codecs auto it adds "codecs" (geotrain.cost.codec_choice: per-stage DP codecs, per-cut
activation codecs, predicted cost with and without them; `geotrain train --plan` applies them).
With --wan-recipe auto it adds "wan_recipe" (geotrain.cost.wan_recipe: sync period H, fragments P, delay tau,
mix, outer codec and outer optimizer, with the predicted step; `geotrain train --plan` runs them), with
"local_steps" ("equal", or "adaptive" where the replicas differ in speed and it predicts the lower step:
cost.wan_recipe.choose_local_steps), "replica_steps", "replica_compute_s", "replica_compute_fraction" (per
replica, predicted) and "local_steps_step_s" (each schedule's predicted step), "outer_sync" ("sync", or "async"
where asynchronous outer updates are charged the lower step: cost.async_outer; `--recipe-outer-sync sync` leaves
them out), "async_staleness_factor" and "outer_sync_step_s" (sync's and async's predicted step). On a
cluster whose replicas differ in GPU speed it also adds "site_compute" (geotrain.cost.batch_shares: per-step
data parallelism with speed-proportional batch shares against the recipe, by predicted step seconds, and
each site's predicted compute fraction of the winner); when the shares win, the plan holds "batch_shares"
{"rule": "speed", "samples", ...} instead of "wan_recipe" (`geotrain train --plan` runs --batch-shares speed).
With --uneven-split (cost models yuan+compute and schedule) every assignment is scored with the
speed-optimal uneven split of the job's layers (cost/layer_split.py) and the JSON adds "split":
{"rule", "layers", "counts", "boundaries", "shares", "stage_tflops", "cost_equal_split"}
(`geotrain train --plan` cuts the model there).
With --exclude-devices / --membership it plans on the live devices only: "assignment" still names devices of
the full cluster file, and the JSON adds "membership": {"excluded_devices", "excluded_device_names",
"live_devices", "cluster_devices"} (cli/membership_args.py).
"""

from __future__ import annotations

import sys
import time
from dataclasses import fields, replace
from typing import Any

import numpy as np

from geotrain.cli.arg_types import output_file, positive_float, seed
from geotrain.cli.help_format import DefaultsRawDescriptionHelpFormatter
from geotrain.cli.membership_args import add_membership_arguments, membership_of
from geotrain.cli.output import Output, write_json_file
from geotrain.cli.plan_autoconfig import add_autoconfig_arguments, run_autoconfig
from geotrain.cli.placement_args import (DEFAULT_JOB, add_placement_arguments, assignment_rows, build_placement,
                                         region_legend)
from geotrain.cli.plan_explain import Option, explain_choice
from geotrain.cli.plan_shards import add_shards_argument, shard_slots, sharded_compute_s
from geotrain.cli.plan_money import (add_objective_argument, check_objective, money_line, plan_money,
                                    sharded_plan_money)
from geotrain.cli.plan_codec_placement import place_with_codecs
from geotrain.cli.plan_recipe import (RECIPE_COST_MODEL, PricedRecipe, add_calibration_argument, add_recipe_arguments,
                                      calibration_of, devices_that_fit, outer_state_document, price_recipe,
                                      recipe_documents,
                                      layout_memory_bytes, recipe_tables, too_few_devices)
from geotrain.cluster import Cluster, load_cluster
from geotrain.cluster.gpus import UNKNOWN_GPU
from geotrain.cluster.membership import restrict_cluster
from geotrain.cost import DEFAULT_COST_MODEL, CostModel, build_cost_model
from geotrain.cost.registry import MIXED_GPUS_COST_MODEL
from geotrain.cost.codec_choice import (DEFAULT_POLICY, DEFAULT_TOLERANCE, DP_LADDER, PP_LADDER, CodecChoice,
                                        choose_codecs, parse_codec_policy)
from geotrain.errors import GeotrainError, shown
from geotrain.job import Job, load_job
from geotrain.cost.shards import Sharding, lift_slots, slot_cluster
from geotrain.plan import Plan, PlanShards, cluster_record, job_record, plan_codecs, plan_split
from geotrain.search import SEARCH_METHODS, PlacementProblem, SearchError, SearchResult, run_search
from geotrain.search.bound_beside import BoundBeside, usable_cores
from geotrain.search.autoconfig import SHARDS_ALWAYS
from geotrain.search.bounds import gap
from geotrain.yaml_text import parse_document

DEFAULT_METHOD = "auto"
BOUND_SHARE = 0.4
"""With --lower-bound and --time-limit T (no --bound-time-limit): the bound's share of T."""
EXACT_BOUND_SHARE = 0.15
"""The bound's share when auto's exact MILP certifies its own plan (region-uniform clusters)."""
DEFAULT_BOUND_TIME_LIMIT_S = 30.0
# Shortcut flags for common method options; each sets options[name] when given.
OPTION_FLAGS = (("iterations", int, "local-search: swaps tried per restart"),
                ("restarts", int, "local-search: random starting points"),
                ("samples", int, "random: assignments to score"))


def register(subparsers: Any) -> None:
    methods = "\n".join(
        f"  {name}: {method.summary}\n      options: "
        + (", ".join(f"{f.name}={f.default}" for f in fields(method.config_type)) or "none")
        for name, method in SEARCH_METHODS.items())
    parser = subparsers.add_parser(
        "plan", help="search a placement of stages x replicas onto devices",
        description="Search a placement of S stages x R replicas; --json prints one JSON object.",
        epilog=f"methods and their options (-o KEY=VALUE):\n{methods}", formatter_class=DefaultsRawDescriptionHelpFormatter)
    add_placement_arguments(parser, cost_model_help="cost model of the placement search (default: "
                                                    "yuan; schedule on a cluster of GPUs of more than one type "
                                                    "with --method auto and no --lower-bound; "
                                                    "with --wan-recipe auto, yuan+compute; "
                                                    "auto-configuration ranks with schedule unless yuan+compute "
                                                    "is given)")
    parser.add_argument("--stages", type=int, default=None,
                        help="pipeline stages S (with --replicas; give neither to auto-configure S, R, M and devices)")
    parser.add_argument("--replicas", type=int, default=None, help="data-parallel replicas R")
    parser.add_argument("--method", default=DEFAULT_METHOD, choices=sorted(SEARCH_METHODS), help="search method")
    parser.add_argument("--seed", type=seed, default=0, help="RNG seed (same seed, same plan)")
    parser.add_argument("--time-limit", type=positive_float, default=None, metavar="SEC",
                        help="the whole command's budget: the search (auto spends all of it: exact, heuristics, "
                             "then restarts, genetic runs, region-path MILPs and large-neighbourhood MILPs seeded from "
                             "the best plan) and, "
                             "with --lower-bound, the bound (beside the search on two or more cores, else a share: see "
                             "--bound-time-limit) return within "
                             "SEC x 1.1 + start-up; the result then depends on machine speed. Without it, auto "
                             "runs exact, hierarchical and genetic once (fast)")
    parser.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                        help="method option, repeatable (e.g. -o iterations=3000 -o strict=true)")
    for name, kind, text in OPTION_FLAGS:
        parser.add_argument(f"--{name}", type=kind, default=None, help=f"{text} (same as -o {name}=N)")
    parser.add_argument("--strict", action="store_true", help="local-search: accept only improving swaps")
    parser.add_argument("--out", default=None, type=output_file, metavar="FILE", help="also write the plan JSON to FILE")
    parser.add_argument("--lower-bound", action="store_true",
                        help="also prove a lower bound on the optimum (JSON gains lower_bound and gap)")
    parser.add_argument("--bound-time-limit", type=positive_float, default=None, metavar="SEC",
                        help="time for the lower bound (its MILPs run in a child process ended at the limit; the "
                             "bound stays valid when it stops early); default with --time-limit T on two or more "
                             "cores and --method auto: the bound runs beside the search, from its first plan until "
                             "T; otherwise "
                             f"{BOUND_SHARE:g} of T after the search; without --time-limit "
                             f"{DEFAULT_BOUND_TIME_LIMIT_S:g} s after it. Given, the bound runs after the search "
                             "for SEC")
    group = parser.add_argument_group("codec choice (docs/history/wan.md)")
    group.add_argument("--codecs", default="none", choices=("none", "auto"),
                       help="auto: choose a codec per DP group and per pipeline cut (recorded in the plan)")
    group.add_argument("--codec-policy", default=DEFAULT_POLICY, metavar="dp=CODEC,pp=CODEC",
                       help=f"lowest rung allowed on the ladders dp: {' > '.join(DP_LADDER)}; "
                            f"pp: {' > '.join(PP_LADDER)}")
    group.add_argument("--codec-tolerance", type=float, default=DEFAULT_TOLERANCE, metavar="FRACTION",
                       help="keep better-quality codecs while the predicted time stays within this fraction "
                            "of the fastest allowed choice")
    add_recipe_arguments(parser)
    add_calibration_argument(parser)
    add_objective_argument(parser)
    parser.add_argument("--uneven-split", action="store_true",
                        help="score each placement with the speed-optimal uneven layer split (faster stages take "
                             "more layers; yuan+compute and schedule cost models); the plan records the cut")
    add_shards_argument(parser)
    add_membership_arguments(parser)
    add_autoconfig_arguments(parser)
    parser.set_defaults(handler=run)


def parse_options(args: Any) -> dict[str, Any]:
    """Method options from -o KEY=VALUE (values read as YAML 1.2 scalars, as in files) and the shortcut flags."""
    options: dict[str, Any] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SearchError(f"--option must be KEY=VALUE, got {shown(item)}")
        options[key.strip()] = parse_document(value, f"--option {key.strip()}") if value.strip() else None
    for name, _, _ in OPTION_FLAGS:
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.strict:
        options["strict"] = True
    return options


def time_budget(time_limit_s: float | None, bound_time_limit_s: float | None, with_bound: bool,
                exact_certifies: bool = False) -> tuple[float | None, float]:
    """(search seconds, bound seconds): with a time limit T the two share it (the bound gets
    --bound-time-limit, or BOUND_SHARE of T, or EXACT_BOUND_SHARE when `exact_certifies`: auto on a
    region-uniform cluster, whose exact MILP proves its own bound, so the search gets most of T);
    without one the search is unlimited and the bound gets --bound-time-limit or
    DEFAULT_BOUND_TIME_LIMIT_S. The bound also gets whatever the search leaves of T."""
    if time_limit_s is None:
        return None, bound_time_limit_s or DEFAULT_BOUND_TIME_LIMIT_S
    if not with_bound:
        return time_limit_s, 0.0
    share = EXACT_BOUND_SHARE if exact_certifies else BOUND_SHARE
    bound = min(bound_time_limit_s or share * time_limit_s, 0.9 * time_limit_s)
    return time_limit_s - bound, bound


def search_plan(result: SearchResult, extra: dict[str, Any] | None = None) -> Plan:
    """The Plan `plan --json` prints (and `--out` writes), built from the search result; `extra`: further
    recorded fields (options, seed, cluster, job, cost_model)."""
    stages, replicas = result.assignment.shape
    recorded: dict[str, Any] = {"evaluations": result.evaluations, "details": result.details}
    if result.lower_bound is not None:
        recorded["lower_bound"] = result.lower_bound
        recorded["gap"] = gap(result.cost.total, result.lower_bound)
        recorded["lower_bound_source"] = result.details.get("lower_bound_source", result.method)
    return Plan(stages=int(stages), replicas=int(replicas), assignment=result.assignment, method=result.method,
                cost=result.cost.to_json(), seconds=result.seconds, extra={**recorded, **(extra or {})})


def run(args: Any) -> int:
    started = time.perf_counter()  # --time-limit counts from here: loading the cluster and model included
    out = Output(json_mode=args.json)
    if args.stages is None and args.replicas is None:
        if args.exclude_devices is not None or args.membership is not None:
            raise GeotrainError("--exclude-devices / --membership re-plan a fixed layout: give --stages and "
                                "--replicas (the checkpoint's S, and the replicas the live devices hold)")
        if args.codecs != "none":
            raise GeotrainError("--codecs auto applies to a fixed layout: give --stages and --replicas")
        if args.uneven_split:
            raise GeotrainError("--uneven-split applies to a fixed layout: give --stages and --replicas")
        return run_autoconfig(args, out)
    outer_state = outer_state_document(args)
    if args.stages is None or args.replicas is None:
        raise SearchError("give both --stages and --replicas, or neither (auto-configuration)")
    full_cluster = load_cluster(args.cluster)
    check_objective(args, full_cluster, fixed_layout=True)
    membership = membership_of(args, full_cluster)
    typed = UNKNOWN_GPU not in full_cluster.gpus  # GPU types given: speeds and memory are known
    if args.cost_model is None:  # a recipe weighs compute against links, as GPUs of mixed speeds do
        mixed = typed and len(set(full_cluster.gpus)) > 1 and args.method == "auto" and not args.lower_bound
        args.cost_model = (RECIPE_COST_MODEL if args.wan_recipe == "auto" and typed
                           else MIXED_GPUS_COST_MODEL if mixed else DEFAULT_COST_MODEL)
    job = load_job(args.job)  # read once: the calibration's note and the placement take it
    calibration = calibration_of(args, job)
    base = real = full_cluster if membership is None else membership.live_cluster()
    slots = sharding = None
    if args.shards == SHARDS_ALWAYS:
        raise GeotrainError("--shards auto applies to auto-configuration: give --shards K with --stages/--replicas, "
                            "or neither --stages nor --replicas")
    if (args.shards or 1) > 1:  # placed slot by slot: the search sees one device per slot (cost.shards)
        slots, sharding = shard_slots(args, base)
        base = slot_cluster(base, slots)
    cluster, job, model = build_placement(args, args.stages, args.replicas, cluster=base, sharding=sharding, job=job)
    fit, live = None, cluster
    if typed:  # without GPU types, no memory to check (nor speed to place by)
        cluster, model, fit = devices_by_memory(args, cluster, job, model, sharding)
    policy = parse_codec_policy(args.codec_policy, args.codec_tolerance) if args.codecs == "auto" else None
    options = parse_options(args)
    problem = PlacementProblem(cluster, model)
    if args.lower_bound and model.pairwise_terms() is None:  # before the search, not after it
        raise SearchError(f"--lower-bound needs a pairwise cost model (like 'yuan'); {model.name!r} is not pairwise")
    left = None if args.time_limit is None else max(0.1, args.time_limit - (time.perf_counter() - started))
    exact_certifies = args.method == "auto" and cluster.is_region_uniform() and model.pairwise_terms() is not None
    beside = None
    if (args.lower_bound and left is not None and args.bound_time_limit is None and usable_cores() >= 2
            and SEARCH_METHODS[args.method].reports_plans):  # a method that tells its plans while it searches
        beside = BoundBeside(problem, time.perf_counter() + left)  # the bound on another core, from the first plan
        search_limit, bound_limit = left, 0.0
    else:
        search_limit, bound_limit = time_budget(left, args.bound_time_limit, args.lower_bound, exact_certifies)
    with out.progress(f"{args.method} on {cluster.name}", 1) as progress:
        result = run_search(args.method, problem, seed=args.seed, time_limit_s=search_limit,
                            progress=progress, options=options, on_plan=None if beside is None else beside.offer)
    if beside is not None:
        with out.progress("lower bound", 1):
            result = beside.finish(result)
    elif args.lower_bound and not result.proven_optimal:
        from geotrain.search.bounds import with_lower_bound

        if args.time_limit is not None:  # the bound gets what the search left of the budget, no more
            bound_limit = max(0.0, args.time_limit - (time.perf_counter() - started))
        with out.progress("lower bound", 1):
            result = with_lower_bound(problem, result, time_limit_s=bound_limit)
    placed_codecs = None
    if policy is not None and model.name == "yuan" and args.time_limit is None and not args.lower_bound:
        with out.progress(f"{args.method} for compressed activations", 1):  # placement and codecs together
            placed_codecs = place_with_codecs(
                cluster, job, result, policy, evaluate=model.evaluate,
                search=lambda m: run_search(args.method, PlacementProblem(cluster, m), seed=args.seed, options=options))
        result = placed_codecs.result
    plan = search_plan(result, {"options": options, "seed": args.seed, **cluster_record(full_cluster),
                                **job_record(job), "global_batch": job.global_batch, "cost_model": model.name,
                                "time_limit_s": args.time_limit,
                                **({"calibration": calibration} if calibration else {}),
                                "wall_seconds": time.perf_counter() - started})
    if args.uneven_split:
        split = uneven_split_document(cluster, job, model, result.assignment, args.utilisation)
        plan = replace(plan, split=plan_split(split, plan.stages))
    choice = placed_codecs.choice if placed_codecs is not None else (
        None if policy is None else choose_codecs(cluster, job, result.assignment, policy))
    if choice is not None:
        placement = {} if placed_codecs is None else {"placement": placed_codecs.to_json()}
        plan = replace(plan, codecs=plan_codecs({**choice.to_json(), **placement}, plan.stages))
    priced = None
    if args.wan_recipe == "auto":
        compute = None if sharding is None else sharded_compute_s(cluster, job, result.assignment, sharding,
                                                                  args.utilisation)
        priced = price_recipe(args, cluster, job, result.assignment, result.cost.dp, result.cost.pp,
                              compute_s=compute, utilisation=args.utilisation)
        plan = replace(plan, extra={**plan.extra, **recipe_documents(cluster, result.assignment, priced),
                                    **outer_state})
    option = fixed_option(args, cluster, job, result, priced)  # explained on the live devices, memory's exclusions too
    placed = option.assignment if fit is None else fit[option.assignment]
    if slots is not None:  # explained on the devices: every device of every slot
        live, placed = real, lift_slots(slots, placed)
    explanation = explain_choice(live, [replace(option, assignment=placed)])
    if placed_codecs is not None and len(placed_codecs.tried) > 1:
        explanation.append(placed_codecs.line())
    money = None if cluster.prices is None else (
        plan_money(cluster, job, result.assignment, option.step_s, priced) if slots is None
        else sharded_plan_money(real, job, placed, option.step_s, priced))
    if money is not None:
        explanation.append(money_line(money, args.recipe_steps))
        plan = replace(plan, extra={**plan.extra, "money": money.to_json(cluster.region_names, args.recipe_steps)})
    plan = replace(plan, extra={**plan.extra, "explanation": explanation})
    if fit is not None:  # searched on the devices that hold the recipe's memory
        plan = replace(plan, assignment=fit[plan.assignment])
    if slots is not None:  # slot-cluster devices -> each slot's K devices (its first in "assignment")
        devices = lift_slots(slots, plan.assignment)
        plan = replace(plan, assignment=devices[..., 0], shards=PlanShards(devices, extra=sharding.to_json()))
    if membership is not None:  # searched on the live devices; the file names the full cluster's
        plan = replace(plan, assignment=membership.lift(plan.assignment),
                       shards=None if plan.shards is None else replace(plan.shards,
                                                                       devices=membership.lift(plan.shards.devices)),
                       extra={**plan.extra, "membership": membership.to_json()})
    if args.out:
        write_json_file(plan.to_json(), args.out)
    if args.json:
        out.emit_json(plan.to_json())
        return 0
    cost = result.cost
    rows = [["method", result.method], ["layout", f"{args.stages} stages x {args.replicas} replicas"],
            ["cluster", f"{cluster.name} ({cluster.n_devices} "
                        f"{f'slots of {plan.k} devices' if plan.k > 1 else 'devices'}, {cluster.n_regions} regions)"],
            *([["excluded devices", ", ".join(full_cluster.device_names[d] for d in membership.excluded) or "-"]]
              if membership is not None else []),
            ["job / cost model", f"{job.name} / {model.name}"],
            ["dp (s)", f"{cost.dp:.3f}"], ["pp (s)", f"{cost.pp:.3f}"], ["total (s)", f"{cost.total:.3f}"],
            ["search seconds", f"{result.seconds:.2f}"], ["evaluations", f"{result.evaluations:,}"]]
    if result.lower_bound is not None:
        rows.append(["lower bound (s)", f"{result.lower_bound:.3f}"])
        rows.append(["gap to bound", f"{100 * gap(cost.total, result.lower_bound):.2f}%"])
    out.table("plan", ["", "value"], rows, right_align_from=2)
    out.table("assignment (device per stage x replica)", ["", *(f"r{r}" for r in range(args.replicas))],
              assignment_rows(full_cluster, plan.assignment), right_align_from=1)
    out.text(region_legend(full_cluster))
    if plan.shards is not None:
        out.table(f"shards: {plan.k} devices of one site per slot (FSDP2), the first as in the assignment",
                  ["", *(f"r{r}" for r in range(args.replicas))],
                  [[f"stage {s}", *("+".join(str(d) for d in slot) for slot in row)]
                   for s, row in enumerate(plan.shards.devices.tolist())])
    if plan.split is not None:
        split_table(out, plan.split.to_json(), cost.total)
    if choice is not None:
        codec_tables(out, choice)
        if placed_codecs is not None and len(placed_codecs.tried) > 1:
            out.table("placement for the codecs (s per iteration with codecs, yuan)", ["placement searched", "total"],
                      [[name, f"{total:.3f}"] for name, total in placed_codecs.tried.items()])
    if priced is not None:
        recipe_tables(out, cluster, result.assignment, priced)
    for line in explanation:
        out.text(line)
    if args.out:
        out.text(f"plan written to {args.out}")
    return 0


def fixed_option(args: Any, cluster: Cluster, job: Job, result: SearchResult, priced: PricedRecipe | None) -> Option:
    """The explanation's view of a fixed layout's plan: its recipe's step (or the chosen shares'), else the cost
    model's total; compute as its model counts it (none for the communication-only models); memory per device
    as cost.memory gives it for one sequence per micro-batch (with the outer optimizer's state under a recipe)."""
    label = f"{args.stages} x {args.replicas}" + (f" x {args.shards} shards" if (args.shards or 1) > 1 else "")
    if priced is not None:
        return Option(label, result.assignment, priced.step_s, priced.busiest_compute_s,
                      layout_memory_bytes(job, args.stages, args.replicas, args.shards or 1,
                                          outer_state=args.outer_state), priced.scheme)
    extra = result.cost.extra or {}
    compute = float(extra.get("pipeline", extra.get("compute", 0.0)))
    memory = layout_memory_bytes(job, args.stages, args.replicas, args.shards or 1, recipe=False)
    scheme = "per-step data parallelism" if args.replicas > 1 else "one replica"
    return Option(label, result.assignment, result.cost.total, compute, memory, scheme)


def devices_by_memory(args: Any, cluster: Cluster, job: Job, model: CostModel,
                      sharding: Sharding | None = None) -> tuple[Cluster, CostModel, np.ndarray | None]:
    """A fixed layout: the devices whose memory holds a stage (plan_recipe.layout_memory_bytes; with
    --wan-recipe auto the outer sync's state too). All of them: `cluster` and `model` as they were and no
    index map; some: the cluster of those devices, its cost model and their indices (a note on stderr names the
    devices left out); fewer than S x R: refused in one line, except for the seed's default job (DEFAULT_JOB: a
    stand-in, not the user's model), where one note says so and the plan goes on."""
    recipe = args.wan_recipe == "auto"
    need = layout_memory_bytes(job, args.stages, args.replicas, args.shards or 1, recipe=recipe,
                               outer_state=args.outer_state)
    fit = devices_that_fit(cluster, need)
    if fit.size == cluster.n_devices:
        return cluster, model, None
    layout = (f"--stages {args.stages} --replicas {args.replicas}" + (f" --shards {args.shards}" if (args.shards or 1) > 1
                                                                       else "")
              + (" with --wan-recipe auto" if recipe else ""))
    if fit.size < args.stages * args.replicas:
        line = too_few_devices(cluster, need, fit, layout, recipe=recipe and args.outer_state == "device")
        if args.job != DEFAULT_JOB:
            shards = "" if (args.shards or 1) > 1 else ", shard each slot over a site's devices (--shards K)"
            raise GeotrainError(f"{line}. Use more stages (--stages){shards}, or let the planner choose the layout "
                                f"(no --stages/--replicas)")
        print(f"geotrain: note: job {job.name!r} (the default; give --job for your model's): {line}", file=sys.stderr)
        return cluster, model, None
    left_out = sorted(set(range(cluster.n_devices)) - set(fit.tolist()))
    print(f"geotrain: note: {layout}: {len(left_out)} devices cannot hold {need / 1e9:.3g} GB per device "
          f"and are left out: {', '.join(f'{cluster.device_names[d]} ({cluster.gpus[d]})' for d in left_out)}",
          file=sys.stderr)
    sub = restrict_cluster(cluster, fit)
    shares = "speed" if args.uneven_split else None
    return sub, build_cost_model(args.cost_model, sub, job, args.stages, args.replicas, layer_shares=shares,
                                 utilisation=args.utilisation, sharding=sharding), fit


def codec_tables(out: Output, choice: CodecChoice) -> None:
    """The chosen codecs and the predicted seconds per iteration with and without them ("yuan" model)."""
    rows = [[f"stage {s} DP group", name] for s, name in enumerate(choice.dp)]
    rows += [[f"cut {c} (stage {c} -> {c + 1})", name] for c, name in enumerate(choice.pp)]
    out.table(f"codecs (policy {choice.policy.text()}, tolerance {choice.policy.tolerance:g})", ["", "codec"], rows)
    out.table("predicted communication per iteration (s, yuan)", ["", "uncompressed", "with codecs", "speed-up"],
              [[key, f"{choice.uncompressed[key]:.3f}", f"{choice.cost[key]:.3f}",
                f"{choice.uncompressed[key] / choice.cost[key]:.2f}x" if choice.cost[key] > 0 else "-"]
               for key in ("dp", "pp", "total")])


def uneven_split_document(cluster: Any, job: Any, model: Any, assignment: Any,
                          utilisation: float | None = None) -> dict[str, Any]:
    """The plan's "split" object: the speed split of `assignment` (StageShares.describe) and the cost the
    same cost model predicts with the equal split (1/S per stage)."""

    stages, replicas = assignment.shape
    equal = build_cost_model(model.name, cluster, job, int(stages), int(replicas), utilisation=utilisation)
    return {**model.shares.describe(assignment), "cost_equal_split": equal.evaluate(assignment).to_json()}


def split_table(out: Output, split: dict[str, Any], total_s: float) -> None:
    """Layers per stage of the uneven split and the predicted iteration with the equal and uneven split."""
    rows = [[f"stage {s}", f"{tflops:g}", f"{count}", f"{share:.3f}"]
            for s, (tflops, count, share) in enumerate(zip(split["stage_tflops"], split["counts"], split["shares"]))]
    out.table(f"uneven split of {split['layers']} layers (boundaries {split['boundaries']})",
              ["", "slowest GPU TFLOP/s", "layers", "share"], rows)
    equal = split["cost_equal_split"]["total"]
    out.table("predicted iteration (s) of this placement", ["equal split", "uneven split", "speed-up"],
              [[f"{equal:.3f}", f"{total_s:.3f}", f"{equal / total_s:.2f}x" if total_s > 0 else "-"]])
