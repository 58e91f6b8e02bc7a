"""`bench wan`'s recipe row: what `geotrain plan --wan-recipe auto` chooses (geotrain.cost.wan_recipe), run.

The planner's inputs are the cluster's links, the job's bytes and the compute seconds per step, which the
bench takes from the DDP baseline it ran first (its compute fraction x its step time: the same per-replica
batch on this CPU). For every planned layout the recipe is chosen (pipeline seconds of that layout added
per step); the layout with the lowest predicted step runs (a recipe with tau > 0 is scored by the
runtime's in-run evaluation: bench.wan.run_row), with the recipe's H, P, tau, mix, codec and
outer optimizer as RuntimeConfig options. The row's result carries the prediction (`predicted_step_s`)
beside the measured step time, and the recipe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from geotrain.bench.wan_rows import RowResult, WanBenchConfig, WanRow
from geotrain.cluster import Cluster
from geotrain.cost.wan_recipe import WanRecipe, choose_recipe
from geotrain.job import Job


def baseline_compute_s(baseline: RowResult) -> float:
    """Compute seconds per step of the baseline row (its compute fraction x its emulated step time)."""
    return baseline.compute_fraction * baseline.step_time_s


def plan_recipe(cluster: Cluster, job: Job, layouts: dict[str, Any], config: WanBenchConfig,
                compute_s: float) -> tuple[str, WanRecipe]:
    """(layout name, recipe) with the lowest predicted step among `layouts` (bench.wan.PlannedLayout)."""
    recipes = {name: choose_recipe(cluster, job, layout.assignment, compute_s, pp_s=layout.pp_s,
                                   total_steps=config.steps, max_delay=0) for name, layout in layouts.items()}
    name = min(recipes, key=lambda key: recipes[key].step_s)
    return name, recipes[name]


def recipe_options(recipe: WanRecipe) -> tuple[tuple[str, Any], ...]:
    """The recipe as a bench row's RuntimeConfig options (the codec goes in the row's dp_codec)."""
    return tuple((key, value) for key, value in recipe.runtime_settings()["optim"].items())


def run_recipe_row(row: WanRow, cluster: Cluster, job: Job, layouts: dict[str, Any], config: WanBenchConfig,
                   tokens: Any, baseline: RowResult, progress: Callable[[str, int, int], None] | None) -> RowResult:
    """Plan the recipe, train it as a row, and attach the prediction."""
    from geotrain.bench.wan import run_row

    name, recipe = plan_recipe(cluster, job, layouts, config, baseline_compute_s(baseline))
    planned = dataclasses.replace(row, dp_codec=recipe.codec, options=recipe_options(recipe))
    callback = None if progress is None else (lambda done, total: progress(row.label, done, total))
    result = run_row(planned, cluster, layouts[name].assignment, None, config, tokens, callback)
    return dataclasses.replace(result, predicted_step_s=recipe.step_s, recipe=recipe.to_json())
