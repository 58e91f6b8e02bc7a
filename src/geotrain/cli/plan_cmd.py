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

import time
from dataclasses import fields, replace
from typing import Any

from geotrain.cli.arg_types import output_file, positive_float, seed
from geotrain.cli.help_format import DefaultsRawDescriptionHelpFormatter
from geotrain.cli.membership_args import add_membership_arguments, membership_of
from geotrain.cli.output import Output, write_json_file
from geotrain.cli.plan_autoconfig import add_autoconfig_arguments, run_autoconfig
from geotrain.cli.placement_args import add_placement_arguments, assignment_rows, build_placement, region_legend
from geotrain.cluster import load_cluster
from geotrain.cost.batch_shares import (SharesChoice, choose_shares, heterogeneous, replica_compute_seconds,
                                        replica_labels)
from geotrain.cost.codec_choice import (DEFAULT_POLICY, DEFAULT_TOLERANCE, DP_LADDER, PP_LADDER, CodecChoice,
                                        choose_codecs, parse_codec_policy)
from geotrain.cost.wan_recipe import (DEFAULT_CODEC_FLOOR, OUTER_LADDER, WanRecipe, choose_local_steps,
                                      estimated_compute_s, outer_ladder)
from geotrain.errors import GeotrainError, shown
from geotrain.plan import Plan, cluster_record, job_record, plan_codecs, plan_split
from geotrain.search import SEARCH_METHODS, PlacementProblem, SearchError, SearchResult, run_search
from geotrain.search.bound_beside import BoundBeside, usable_cores
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
    add_placement_arguments(parser)
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
    recipe = parser.add_argument_group("WAN recipe: Streaming DiLoCo settings chosen by cost (docs/history/wan.md)")
    recipe.add_argument("--wan-recipe", default="none", choices=("none", "auto"),
                        help="auto: choose sync period H, fragments P, delay tau and the outer codec (recorded in "
                             "the plan as \"wan_recipe\"; `geotrain train --plan` runs them)")
    recipe.add_argument("--compute-s", type=positive_float, default=None, metavar="SEC",
                        help="compute seconds per step (default: the yuan+compute model's estimate from the GPUs)")
    recipe.add_argument("--recipe-steps", type=int, default=None, metavar="N",
                        help="the run's steps: H leaves at least 12 outer steps, and under 100 outer steps the "
                             "outer optimizer averages (lr 1, momentum 0) instead of DiLoCo's 0.7 / 0.9")
    recipe.add_argument("--recipe-max-delay", type=int, default=None, metavar="TAU",
                        help="largest delay tau (default H - 1; 0 where syncs may not be in flight at checkpoints)")
    recipe.add_argument("--recipe-outer-sync", default="auto", choices=("auto", "sync"),
                        help="auto: also price asynchronous outer updates (one stage per replica, fp32 updates; "
                             "cost.async_outer) and choose them where their step, charged for staleness, is lower; "
                             "sync: synchronous only")
    recipe.add_argument("--recipe-codec-floor", default=DEFAULT_CODEC_FLOOR, choices=OUTER_LADDER,
                        help=f"lowest outer codec allowed on the ladder {' > '.join(OUTER_LADDER)}")
    recipe.add_argument("--recipe-measure-codecs", action="store_true",
                        help="time the outer codecs on this machine and price their CPU per sync (use when this "
                             "machine's CPUs are like the training hosts'; default: links only)")
    recipe.add_argument("--recipe-sync-moments", action="store_true",
                        help="each fragment's first outer sync also averages the inner AdamW's moments (train "
                             "--sync-moments --moment-syncs 1: on bench wan local SGD's +0.033 nats against DDP become "
                             "+0.015, for about 3x that sync's bytes); the recipe is priced with them")
    parser.add_argument("--uneven-split", action="store_true",
                        help="score each placement with the speed-optimal uneven layer split (faster stages take "
                             "more layers; yuan+compute and schedule cost models); the plan records the cut")
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
    if args.stages is None or args.replicas is None:
        raise SearchError("give both --stages and --replicas, or neither (auto-configuration)")
    full_cluster = load_cluster(args.cluster)
    membership = membership_of(args, full_cluster)
    cluster, job, model = build_placement(args, args.stages, args.replicas,
                                          cluster=full_cluster if membership is None else membership.live_cluster())
    policy = parse_codec_policy(args.codec_policy, args.codec_tolerance) if args.codecs == "auto" else None
    options = parse_options(args)
    problem = PlacementProblem(cluster, model)
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
    plan = search_plan(result, {"options": options, "seed": args.seed, **cluster_record(full_cluster),
                                **job_record(job), "global_batch": job.global_batch, "cost_model": model.name,
                                "time_limit_s": args.time_limit,
                                "wall_seconds": time.perf_counter() - started})
    if args.uneven_split:
        split = uneven_split_document(cluster, job, model, result.assignment)
        plan = replace(plan, split=plan_split(split, plan.stages))
    choice = None if policy is None else choose_codecs(cluster, job, result.assignment, policy)
    if choice is not None:
        plan = replace(plan, codecs=plan_codecs(choice.to_json(), plan.stages))
    recipe = None if args.wan_recipe == "none" else wan_recipe_of(args, cluster, job, result)
    shares = None if recipe is None else shares_choice_of(args, cluster, job, result, recipe)
    if recipe is not None:
        plan = replace(plan, extra={**plan.extra, **recipe_documents(cluster, result, recipe, shares)})
    if membership is not None:  # searched on the live devices; the file names the full cluster's
        plan = replace(plan, assignment=membership.lift(plan.assignment),
                       extra={**plan.extra, "membership": membership.to_json()})
    if args.out:
        write_json_file(plan.to_json(), args.out)
    if args.json:
        out.emit_json(plan.to_json())
        return 0
    cost = result.cost
    rows = [["method", result.method], ["layout", f"{args.stages} stages x {args.replicas} replicas"],
            ["cluster", f"{cluster.name} ({cluster.n_devices} devices, {cluster.n_regions} regions)"],
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
    if plan.split is not None:
        split_table(out, plan.split.to_json(), cost.total)
    if choice is not None:
        codec_tables(out, choice)
    labels = replica_labels(cluster, result.assignment)
    if shares is not None:
        fractions = [[f"compute fraction {name}", f"{f:.3f}"] for name, f in zip(labels, shares.compute_fraction)]
        out.table("per-step DP with speed batch shares vs the WAN recipe (predicted, yuan)", ["", "value"],
                  [["chosen", shares.chosen],
                   ["samples per replica (speed)", ", ".join(map(str, shares.shares.samples))],
                   ["step, speed shares (s)", f"{shares.shares.step_s:.4g}"],
                   ["step, equal shares (s)", f"{shares.equal.step_s:.4g}"],
                   ["step, WAN recipe (s)", f"{shares.recipe_step_s:.4g}"],
                   *(fractions if shares.chosen == "batch_shares" else [])])
    if recipe is not None and (shares is None or shares.chosen == "wan_recipe"):
        recipe_table(out, recipe, labels)
    if args.out:
        out.text(f"plan written to {args.out}")
    return 0


def recipe_table(out: Output, recipe: WanRecipe, labels: list[str]) -> None:
    """The chosen WAN recipe, its local steps (and both schedules' predicted steps) and each site's predicted
    compute fraction."""
    steps = recipe.local_steps_step_s or {}
    local = ("equal (H on every replica)" if recipe.local_steps == "equal" else
             f"adaptive ({' / '.join(map(str, recipe.replica_steps or ()))} per period at first)")
    fractions = recipe.replica_compute_fraction or ()
    outer_sync = ("synchronous" if recipe.outer_sync == "sync" else
                  f"asynchronous (staleness x{recipe.async_staleness_factor:.3g})")
    out.table("WAN recipe (Streaming DiLoCo, yuan)", ["", "value"],
              [["outer sync", outer_sync],
               *[[f"step, {name} (s)", f"{step:.4g}"] for name, step in (recipe.outer_sync_step_s or {}).items()],
               ["sync every H", str(recipe.sync_every)], ["local steps", local],
               *[[f"step, {name} local steps (s)", f"{step:.4g}"] for name, step in steps.items() if len(steps) > 1],
               ["fragments P", str(recipe.fragments)],
               ["delay tau", str(recipe.delay)], ["mix alpha", f"{recipe.mix:g}"],
               ["landing / warm-up steps", f"{recipe.landing} / {recipe.warmup}"], ["outer codec", recipe.codec],
               ["moment sync", "off" if not recipe.sync_moments else "every sync" if recipe.moment_syncs is None
                else f"each fragment's first {recipe.moment_syncs} syncs"],
               ["outer lr / momentum", f"{recipe.outer_lr:g} / {recipe.outer_momentum:g}"],
               ["one fragment's exchange (s)", f"{recipe.sync_s:.3f}"],
               ["compute per step, busiest (s)", f"{recipe.compute_s:.4g}"],
               ["predicted step (s)", f"{recipe.step_s:.4g}"],
               *[[f"compute fraction {name}", f"{f:.3f}"] for name, f in zip(labels, fractions)]])


def recipe_compute_s(args: Any, cluster: Any, job: Any, result: SearchResult) -> float:
    """The slowest replica's compute seconds per step: --compute-s, else the yuan+compute estimate."""
    return args.compute_s if args.compute_s is not None else estimated_compute_s(cluster, job, result.assignment)


def wan_recipe_of(args: Any, cluster: Any, job: Any, result: SearchResult) -> WanRecipe:
    """--wan-recipe auto: the recipe for the searched assignment (pipeline seconds per step: its pp term), equal
    or adaptive local steps (replica r computes --compute-s, the slowest replica's, x v_min / v_r by GPU peak)."""
    compute_s = recipe_compute_s(args, cluster, job, result)
    codec_s = moment_codec_s = None
    if args.recipe_measure_codecs:
        from geotrain.cost.codec_cpu import sync_codec_seconds_by_codec

        ladder, replicas = outer_ladder(args.recipe_codec_floor), int(result.assignment.shape[1])
        codec_s = sync_codec_seconds_by_codec(ladder, replicas)
        if args.recipe_sync_moments:
            moment_codec_s = sync_codec_seconds_by_codec(ladder, replicas, sync_moments=True)
    return choose_local_steps(cluster, job, result.assignment, replica_compute_seconds(cluster, result.assignment,
                                                                                       compute_s),
                              pp_s=result.cost.pp, total_steps=args.recipe_steps, max_delay=args.recipe_max_delay,
                              floor=args.recipe_codec_floor, sync_moments=args.recipe_sync_moments,
                              codec_s_per_value=codec_s, moment_codec_s_per_value=moment_codec_s,
                              asynchronous=args.recipe_outer_sync == "auto")


def shares_choice_of(args: Any, cluster: Any, job: Any, result: SearchResult,
                     recipe: WanRecipe) -> SharesChoice | None:
    """On a cluster whose replicas differ in speed: speed batch shares with per-step DP (comm: the searched
    plan's dp + pp) against `recipe`; None when the replicas are alike."""
    if not heterogeneous(cluster, result.assignment):
        return None
    return choose_shares(cluster, result.assignment, job.global_batch, recipe_compute_s(args, cluster, job, result),
                         result.cost.dp + result.cost.pp, recipe.step_s, recipe.replica_compute_s)


def recipe_documents(cluster: Any, result: SearchResult, recipe: WanRecipe,
                     shares: SharesChoice | None) -> dict[str, Any]:
    """The plan's "wan_recipe", or "batch_shares" when they win; "site_compute" with either on a
    heterogeneous cluster."""
    if shares is None:
        return {"wan_recipe": recipe.to_json()}
    labels = replica_labels(cluster, result.assignment)
    site = {"site_compute": shares.to_json(labels)}
    if shares.chosen == "wan_recipe":
        return {"wan_recipe": recipe.to_json(), **site}
    return {"batch_shares": {"version": 1, "rule": "speed", **shares.shares.to_json(labels)}, **site}


def codec_tables(out: Output, choice: CodecChoice) -> None:
    """The chosen codecs and the predicted seconds per iteration with and without them ("yuan" model)."""
    rows = [[f"stage {s} DP group", name] for s, name in enumerate(choice.dp)]
    rows += [[f"cut {c} (stage {c} -> {c + 1})", name] for c, name in enumerate(choice.pp)]
    out.table(f"codecs (policy {choice.policy.text()}, tolerance {choice.policy.tolerance:g})", ["", "codec"], rows)
    out.table("predicted communication per iteration (s, yuan)", ["", "uncompressed", "with codecs", "speed-up"],
              [[key, f"{choice.uncompressed[key]:.3f}", f"{choice.cost[key]:.3f}",
                f"{choice.uncompressed[key] / choice.cost[key]:.2f}x" if choice.cost[key] > 0 else "-"]
               for key in ("dp", "pp", "total")])


def uneven_split_document(cluster: Any, job: Any, model: Any, assignment: Any) -> dict[str, Any]:
    """The plan's "split" object: the speed split of `assignment` (StageShares.describe) and the cost the
    same cost model predicts with the equal split (1/S per stage)."""
    from geotrain.cost import build_cost_model

    stages, replicas = assignment.shape
    equal = build_cost_model(model.name, cluster, job, int(stages), int(replicas))
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
