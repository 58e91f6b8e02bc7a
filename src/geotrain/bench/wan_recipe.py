"""`bench wan`'s recipe row: what `geotrain plan --wan-recipe auto` chooses (geotrain.cost.wan_recipe), run.

The planner's inputs are the cluster's links, the job's bytes, the compute seconds per step and the steps
per-step fp32 DP takes to the target (cost.convergence's T0), which the bench takes from the limit row (the
fp32 training on free links: its emulated step time is the compute of one step of the same per-replica batch on
this CPU, measured as every row's time is; its crossing of the target, interpolated between evaluations, is
T0; the recipe row runs after it). For every planned layout the recipe is chosen (that layout's pipeline seconds added per
step, and the outer codecs' CPU per sync timed here, where the bench's ranks run: geotrain.cost.codec_cpu,
as `plan --recipe-measure-codecs`); the layout with the least predicted time to target runs, with the recipe's H, P, tau, mix, codec and
outer optimizer as RuntimeConfig options (tau > 0 is scored by the runtime's in-run evaluation:
bench.wan.run_row). The row's result carries the prediction (`predicted_step_s`) beside the measured
step time, and the recipe (its predicted time to target: `recipe["convergence"]`). (A first version took the compute from the DDP baseline's compute fraction
x step time: 0.361 s, 2.5x the limit row's 0.142 s, because the runtime's compute timer counts wall
seconds of this loaded machine; predicted 0.453 s against 0.282 s measured. Until 2026-12-05 the codecs'
CPU was not priced: the moment-sync recipe was predicted at 0.0937 s per step and measured at 0.1124 s.)
A recipe row's own options ask the planner (RECIPE_OPTIONS: `sync_moments`, its --recipe-sync-moments; without it
"auto": the recipe with moment sync and the one without, the sooner to the target).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from geotrain.bench.wan_rows import RowResult, WanBenchConfig, WanRow
from geotrain.cluster import Cluster
from geotrain.cost.codec_cpu import sync_codec_seconds_by_codec
from geotrain.cost.wan_recipe import WanRecipe, charged_step_seconds, choose_recipe, outer_ladder
from geotrain.job import Job


RECIPE_OPTIONS = ("sync_moments",)
"""A recipe row's options: what it asks the planner for (`geotrain plan --recipe-sync-moments`)."""


def plan_recipe(cluster: Cluster, job: Job, layouts: dict[str, Any], config: WanBenchConfig,
                compute_s: float, sync_moments: bool | str = False,
                target_steps: float | None = None) -> tuple[str, WanRecipe]:
    """(layout name, recipe) with the least predicted time to target among `layouts` (bench.wan.PlannedLayout);
    `sync_moments`: the planner's --recipe-sync-moments (or "auto"); `target_steps`: per-step fp32 DP's steps to
    the target (None: the run's length)."""
    replica_counts = {int(layout.assignment.shape[1]) for layout in layouts.values()}
    codec_s = {replicas: sync_codec_seconds_by_codec(outer_ladder(), replicas)  # the ranks run here
               for replicas in replica_counts}
    moment_codec_s = {replicas: sync_codec_seconds_by_codec(outer_ladder(), replicas, sync_moments=True)
                      for replicas in replica_counts} if sync_moments else {}
    recipes = {name: choose_recipe(cluster, job, layout.assignment, compute_s, pp_s=layout.pp_s,
                                   total_steps=config.steps, sync_moments=sync_moments,
                                   codec_s_per_value=codec_s[int(layout.assignment.shape[1])],
                                   moment_codec_s_per_value=moment_codec_s.get(int(layout.assignment.shape[1])),
                                   target_steps=target_steps)
               for name, layout in layouts.items()}
    name = min(recipes, key=lambda key: charged_step_seconds(recipes[key]))
    return name, recipes[name]


def recipe_options(recipe: WanRecipe) -> tuple[tuple[str, Any], ...]:
    """The recipe as a bench row's RuntimeConfig options (the codec goes in the row's dp_codec)."""
    return tuple((key, value) for key, value in recipe.runtime_settings()["optim"].items())


def run_recipe_row(row: WanRow, cluster: Cluster, job: Job, layouts: dict[str, Any], config: WanBenchConfig,
                   tokens: Any, compute_s: float, progress: Callable[[str, int, int], None] | None,
                   target_steps: float | None = None) -> RowResult:
    """Plan the recipe for `compute_s` seconds of compute per step (and per-step DP's `target_steps` to the target),
    train it as a row, attach the prediction.
    The row's own options are the planner's (RECIPE_OPTIONS); the recipe's settings replace them."""
    from geotrain.bench.wan import run_row

    unknown = sorted(set(dict(row.options)) - set(RECIPE_OPTIONS))
    if unknown:
        raise ValueError(f"recipe row {row.label!r}: options {unknown} are not the planner's ({', '.join(RECIPE_OPTIONS)})")
    name, recipe = plan_recipe(cluster, job, layouts, config, compute_s,
                               sync_moments=dict(row.options).get("sync_moments", "auto"), target_steps=target_steps)
    planned = dataclasses.replace(row, dp_codec=recipe.codec, options=recipe_options(recipe))
    callback = None if progress is None else (lambda done, total: progress(row.label, done, total))
    result = run_row(planned, cluster, layouts[name].assignment, None, config, tokens, callback)
    return dataclasses.replace(result, predicted_step_s=recipe.step_s, recipe=recipe.to_json())
