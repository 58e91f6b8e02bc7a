"""bench wan's recipe row (geotrain.bench.wan_recipe): the planner's inputs and choice, in process."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.bench.wan import PlannedLayout, WanBenchConfig, bench_cluster, model_job
from geotrain.bench.wan_recipe import plan_recipe, recipe_options, run_recipe_row
from geotrain.bench.wan_rows import DEFAULT_ROWS, WanRow
from geotrain.cluster import load_cluster


def test_recipe_row_takes_the_layout_with_the_lowest_predicted_step():
    cluster = load_cluster(bench_cluster("wan-4x1"))
    layouts = {"1x4": PlannedLayout(np.arange(4).reshape(1, 4), 1.0, None, 1.0, 0.0),
               "2x2": PlannedLayout(np.array([[0, 1], [2, 3]]), 0.7, None, 0.4, 0.3)}
    name, recipe = plan_recipe(cluster, model_job(32), layouts, WanBenchConfig(), 0.125)
    # 2x2 pays its 0.3 s pipeline every step; 1x4: H = 5 (60 steps / 12 outer steps), int8-block outer
    # gradients (the direct gather: one 150 ms round + 66 ms, geotrain.comm.gather) in one piece, hidden
    # behind tau = 2 steps of 0.125 s, averaging; landing eagerly after 2 blocking outer periods. More
    # fragments would hide as well, but the warm-up blocks on each of them: 3 fragments of 0.17 s cost
    # 2 x 3 x 0.17 / 60 = 0.017 s per step, one of 0.216 s costs 0.0072
    assert name == "1x4"
    assert (recipe.sync_every, recipe.fragments, recipe.delay, recipe.codec) == (5, 1, 2, "int8-block")
    assert (recipe.outer_lr, recipe.outer_momentum) == (1.0, 0.0)
    # plus the int8-block codec's CPU, timed here: a few ms per sync of the 871,168 values, 1/5 of it per step
    assert 0.125 < recipe.sync_s < 2 * 0.125 and 0 < recipe.step_s - (0.125 + 2 * recipe.sync_s / 60) < 0.01
    assert dict(recipe_options(recipe)) == {"sync_every": 5, "fragments": 1, "sync_delay": 2, "sync_mix": 0.0,
                                            "outer_lr": 1.0, "outer_momentum": 0.0, "sync_landing": "eager",
                                            "sync_warmup": 10}


def test_a_moment_sync_recipe_prices_its_moments_and_runs_with_them():
    cluster = load_cluster(bench_cluster("wan-4x1"))
    layouts = {"1x4": PlannedLayout(np.arange(4).reshape(1, 4), 1.0, None, 1.0, 0.0)}
    _, plain = plan_recipe(cluster, model_job(32), layouts, WanBenchConfig(), 0.085)
    _, moments = plan_recipe(cluster, model_job(32), layouts, WanBenchConfig(), 0.085, sync_moments=True)
    options = dict(recipe_options(moments))
    assert options["sync_moments"] is True and options["moment_syncs"] == 1  # the first sync only
    # the steady syncs send the outer gradients alone; the moment sync (about 3x the bytes, and its codecs'
    # CPU, measured here) is paid once, spread over the run
    if (moments.codec, moments.fragments) == (plain.codec, plain.fragments):
        assert moments.sync_s == plain.sync_s
    assert moments.step_s > plain.step_s


def test_a_recipe_row_takes_only_the_planners_options():
    row = WanRow("recipe", recipe=True, options=(("sync_every", 5),))
    with pytest.raises(ValueError, match="not the planner's"):
        run_recipe_row(row, None, None, {}, WanBenchConfig(), None, 0.1, None)


def test_default_rows_have_two_recipe_rows_one_torchft_row_and_the_limit_last():
    recipes = [row for row in DEFAULT_ROWS if row.recipe]
    assert [dict(row.options).get("sync_moments", False) for row in recipes] == [False, True]
    torchft = [row for row in DEFAULT_ROWS if row.engine == "torchft"]
    assert len(torchft) == 1 and "torchft" in torchft[0].label and torchft[0].sync_every == 5
    assert "limit" in DEFAULT_ROWS[-1].label
