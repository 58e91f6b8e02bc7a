"""The convergence model (geotrain.cost.convergence): each factor by hand, the landing's steps, the plan record,
the interpolated crossing the constants were fitted with, and its one-line refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geotrain.cost import convergence as cv
from geotrain.cost.convergence import Convergence, ConvergenceError, convergence, crossing_step


def test_one_replica_or_a_sync_every_step_is_data_parallelism_itself():
    assert cv.sync_factor(1, 8) == 1.0 and cv.sync_factor(10, 1) == 1.0
    assert cv.sync_factor(5, 4) == pytest.approx(1 + cv.SYNC_PERIOD_COST * 4 * 3 / 4)
    assert cv.sync_factor(10, 4) > cv.sync_factor(5, 4) > 1.0  # more local steps between syncs: more steps


def test_the_factors_multiply_and_eager_landing_adds_its_tau_steps_once():
    plain = convergence(5, 4, codec="int4-block", target_steps=30)
    assert plain.steps == pytest.approx(30 * cv.sync_factor(5, 4) * cv.CODEC_FACTOR["int4-block"])
    eager = convergence(5, 4, codec="int4-block", delay=2, landing="eager", target_steps=30)
    assert eager.stale == 1.0 and eager.landing_steps == 2.0
    assert eager.steps == pytest.approx(plain.steps + 2)
    assert eager.factor == pytest.approx(plain.factor + 2 / 30)
    assert eager.time_to_target_s(0.1) == pytest.approx(0.1 * (plain.steps + 2))
    # the mix rule: (1 - alpha) x tau of the H steps dropped per sync, no landing steps
    mixed = convergence(5, 4, delay=2, mix=0.5, landing="mix", target_steps=30)
    assert (mixed.stale, mixed.landing_steps) == (pytest.approx(1 / (1 - 0.5 * 2 / 5)), 0.0)
    # moment sync and asynchronous staleness scale the steps
    assert convergence(5, 4, sync_moments=True).moments == cv.MOMENT_SYNC_FACTOR
    assert convergence(5, 4, async_staleness=1.3).asynchronous == pytest.approx(1.3 ** cv.ASYNC_STALENESS_WEIGHT)
    # without T0: factors only, no steps or seconds
    unknown = convergence(5, 4, delay=2, landing="eager")
    assert unknown.steps is None and unknown.time_to_target_s(0.1) is None and unknown.factor == unknown.product


def test_adaptive_steps_are_charged_by_the_fastest_replicas_share():
    assert cv.adaptive_factor(5, None) == 1.0 and cv.adaptive_factor(5, [5, 5, 5, 5]) == 1.0
    # bench hetero's first period: 10 / 4 / 4 / 2 inner steps of H = 5
    assert cv.adaptive_factor(5, [10, 4, 4, 2]) == pytest.approx(1 - cv.ADAPTIVE_GAIN * 0.5)


def test_the_plan_record_holds_seconds_and_every_factor_and_reads_back():
    model = convergence(5, 4, codec="int8-block", delay=2, landing="eager", local_steps=[10, 4, 4, 2],
                        target_steps=20)
    doc = model.to_json(0.2)
    assert doc["time_to_target_s"] == pytest.approx(0.2 * model.steps) and doc["landing_steps"] == 2.0
    assert set(doc) >= {"sync", "codec", "local", "stale", "moments", "async", "factor", "target_steps"}
    assert Convergence.from_json(doc) == model


def test_crossing_is_interpolated_between_the_evaluations_around_the_target():
    assert crossing_step([5, 10, 15], [3.0, 2.6, 2.2], 2.4) == pytest.approx(12.5)
    assert crossing_step([5, 10], [2.3, 2.2], 2.4) == 5.0  # already there at the first evaluation
    assert crossing_step([5, 10], [3.0, 2.5], 2.4) is None


@given(st.lists(st.floats(2.0, 4.0), min_size=1, max_size=12), st.floats(2.0, 4.0))
def test_the_crossing_lies_between_the_evaluations_that_bracket_it(losses, target):
    steps = [5 * (i + 1) for i in range(len(losses))]
    found = crossing_step(steps, losses, target)
    first = next((i for i, loss in enumerate(losses) if loss <= target), None)
    if first is None:
        assert found is None
    else:
        assert steps[max(0, first - 1)] <= found <= steps[first]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"codec": "sign"}, "outer codec must be one of none, int8-block"),
    ({"delay": 5}, "0 <= tau < H"),
    ({"target_steps": 0}, "steps to the target must be > 0"),
])
def test_settings_it_cannot_price_are_one_line(kwargs, match):
    with pytest.raises(ConvergenceError, match=match):
        convergence(5, 4, **kwargs)
