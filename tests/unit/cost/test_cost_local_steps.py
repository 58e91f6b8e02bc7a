"""Equal vs adaptive local steps in the cost model: H_r, the period's step by the busiest replica, the per-replica
compute fractions, and the planner's choice between the two schedules."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.cluster import load_cluster
from geotrain.cost.batch_shares import replica_compute_seconds
from geotrain.cost.local_steps import (ADAPTIVE_MAX_DELAY, LocalStepsError, period_local_steps, period_step_seconds,
                                       replica_compute_per_step)
from geotrain.cost.wan_recipe import WanRecipe, choose_local_steps, choose_recipe, recipe_step_seconds
from geotrain.job import Job
from paths import ROOT

HETERO = load_cluster(str(ROOT / "src" / "geotrain" / "bench" / "data" / "hetero-4x1.yaml"))  # A100 V100 L4 T4
ONE_PER_SITE = np.array([[0, 1, 2, 3]])
TINY = Job(name="tiny", params=816896.0, seq_len=96, hidden=128, global_batch=32, layers=4, bytes_per_value=4)


def test_adaptive_steps_share_r_x_h_by_speed_and_the_busiest_replica_paces_the_period():
    compute = [0.1, 0.25, 0.5]
    # 12 steps by 1/c = 10 : 4 : 2 -> 7.5, 3, 1.5; floors 7, 3, 1; the tied remainder goes to the lower rank
    assert list(period_local_steps(compute, 4, "adaptive")) == [8, 3, 1]
    assert list(period_local_steps(compute, 4, "equal")) == [4, 4, 4]
    # busiest: 8 x 0.1 = 0.8 s of compute, then the 0.3 s exchange, per 4 steps
    assert period_step_seconds(0.3, compute, [8, 3, 1], 4, 1, 0) == pytest.approx((0.8 + 0.3) / 4)
    assert period_step_seconds(0.3, compute, [4, 4, 4], 4, 1, 0) == pytest.approx((2.0 + 0.3) / 4)
    # tau 1 of H 4: each replica's exchange lands after a quarter of its period, at least one step: 2, 1, 1 steps
    # (0.2, 0.25, 0.5 s) hide it; exposed 0.1, 0.05, 0
    assert period_step_seconds(0.3, compute, [8, 3, 1], 4, 1, 1) == pytest.approx((0.8 + 0.1) / 4)
    # tau 2: 4, 2 (round(1.5), to even), 1 steps (0.4, 0.5, 0.5 s) hide it all: the busiest compute alone
    assert period_step_seconds(0.3, compute, [8, 3, 1], 4, 1, 2) == pytest.approx(0.8 / 4)
    assert list(replica_compute_per_step(compute, [8, 3, 1], 4)) == pytest.approx([0.2, 0.1875, 0.125])
    with pytest.raises(LocalStepsError, match="finite numbers > 0"):
        period_local_steps([0.1, 0.0], 4, "adaptive")
    with pytest.raises(LocalStepsError, match="one of equal, adaptive"):
        period_local_steps([0.1], 4, "fast")


@pytest.mark.parametrize("sync_s, compute_s, pp_s, h, p, tau", [(0.5, 0.1, 0.0, 5, 1, 0), (0.5, 0.1, 0.0, 5, 1, 4),
                                                               (0.3, 0.1, 0.02, 5, 1, 4), (0.5, 0.1, 0.0, 5, 5, 4)])
def test_alike_replicas_give_the_uniform_formula(sync_s, compute_s, pp_s, h, p, tau):
    uniform = max(compute_s + pp_s + max(0.0, sync_s - tau * compute_s) * p / h, sync_s * p / h)
    assert recipe_step_seconds(sync_s, compute_s, pp_s, h, p, tau) == pytest.approx(uniform)
    assert period_step_seconds(sync_s, [compute_s] * 3, [h] * 3, h, p, tau, pp_s) == pytest.approx(uniform)


def test_the_planner_picks_adaptive_steps_on_mixed_gpus_and_predicts_each_sites_compute_fraction():
    compute = replica_compute_seconds(HETERO, ONE_PER_SITE, 0.5)  # the T4's 0.5 s, x 65 / peak elsewhere
    assert compute == pytest.approx(0.5 * 65 / np.array([312, 125, 121, 65]))
    overlapped = choose_local_steps(HETERO, TINY, ONE_PER_SITE, compute, total_steps=60)
    recipe = choose_local_steps(HETERO, TINY, ONE_PER_SITE, compute, total_steps=60, max_delay=0)  # blocking syncs
    # an overlapped exchange keeps the busiest site computing with a shorter period (better quality per the rule)
    assert overlapped.local_steps == "adaptive" and overlapped.sync_every <= recipe.sync_every
    assert overlapped.delay <= (overlapped.sync_every if ADAPTIVE_MAX_DELAY is None else ADAPTIVE_MAX_DELAY)
    assert recipe.local_steps == "adaptive" and recipe.fragments == 1 and recipe.delay == 0
    assert set(recipe.local_steps_step_s) == {"equal", "adaptive"}
    assert recipe.step_s == recipe.local_steps_step_s["adaptive"] < recipe.local_steps_step_s["equal"]
    h = recipe.sync_every
    # by hand: n_r from R x H by speed; the period is the busiest n_r c_r plus the blocking exchange
    ideal = 4 * h * np.array([312, 125, 121, 65]) / 623
    steps = np.floor(ideal)
    steps[np.argsort(steps - ideal)[: int(4 * h - steps.sum())]] += 1
    assert list(recipe.replica_steps) == list(steps.astype(int))
    period = max(steps * compute) + recipe.sync_s
    assert recipe.step_s == pytest.approx(period / h)
    assert recipe.replica_compute_fraction == pytest.approx(tuple(steps * compute / period))
    assert recipe.runtime_settings()["optim"]["local_steps"] == "adaptive"
    assert WanRecipe.from_json(recipe.to_json()) == recipe


def test_alike_replicas_keep_equal_steps_and_the_equal_recipe():
    recipe = choose_local_steps(HETERO, TINY, ONE_PER_SITE, [0.2] * 4, total_steps=60)
    assert recipe.local_steps == "equal" and recipe.local_steps_step_s == {"equal": recipe.step_s}
    assert "local_steps" not in recipe.runtime_settings()["optim"]
    plain = choose_recipe(HETERO, TINY, ONE_PER_SITE, 0.2, total_steps=60)
    assert (recipe.sync_every, recipe.fragments, recipe.delay, recipe.codec, recipe.step_s) == (
        plain.sync_every, plain.fragments, plain.delay, plain.codec, plain.step_s)
    assert recipe.replica_compute_fraction == pytest.approx((plain.compute_fraction,) * 4)


def test_adaptive_max_delay_matches_what_the_runtime_runs():
    """Flip ADAPTIVE_MAX_DELAY (cost/local_steps.py) when the runtime runs adaptive steps with a sync delay."""
    from geotrain.runtime import RuntimeConfig, RuntimeConfigError

    recipe = WanRecipe(5, 1, 1, 0.0, "int8-block", 1.0, 0.0, 0.1, 0.1, 0.1, "eager", 10, local_steps="adaptive")
    settings = {**recipe.runtime_settings()["optim"], "dp_codec": recipe.codec}
    try:
        RuntimeConfig.of(HETERO, ONE_PER_SITE, steps=60, emulate_gpu_speed=True, **settings)
        runs = True
    except RuntimeConfigError:
        runs = False
    assert runs == (ADAPTIVE_MAX_DELAY != 0)


def test_the_planner_prices_adaptive_steps_for_replicas_of_two_stages_by_their_slowest_stage():
    # stage 0 on the A100 and the L4, stage 1 on the V100 and the T4: replica 0 is paced by the V100, replica 1 by the
    # T4 (the runtime agrees a replica's step time over its stages: the slowest paces it)
    two_stages = np.array([[0, 2], [1, 3]])
    compute = replica_compute_seconds(HETERO, two_stages, 0.5)
    assert compute == pytest.approx(0.5 * 65 / np.array([125, 65]))
    recipe = choose_local_steps(HETERO, TINY, two_stages, compute, total_steps=60, max_delay=0)
    assert recipe.local_steps == "adaptive" and set(recipe.local_steps_step_s) == {"equal", "adaptive"}
    assert recipe.replica_steps[0] > recipe.replica_steps[1] and sum(recipe.replica_steps) == 2 * recipe.sync_every
