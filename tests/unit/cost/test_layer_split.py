"""split_layers: the exact DP equals the brute-force reference; uneven splits follow cost and device speed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.models import (
    LayerModelError,
    ModelOptions,
    even_boundaries,
    layer_costs,
    load_model_spec,
    measure_layer_times,
    split_layers,
    split_layers_reference,
    stage_speeds,
    stage_times,
)


@st.composite
def split_problems(draw):
    n = draw(st.integers(1, 9))
    stages = draw(st.integers(1, n))
    costs = draw(st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=n, max_size=n))
    weights = draw(st.none() | st.lists(st.floats(0.1, 10.0), min_size=stages, max_size=stages))
    return costs, stages, weights


@settings(max_examples=300, deadline=None)
@given(split_problems())
def test_dp_split_is_as_good_as_trying_every_cut(problem):
    costs, stages, weights = problem
    fast = split_layers(costs, stages, weights)
    reference = split_layers_reference(costs, stages, weights)
    assert len(fast) == stages + 1 and fast[0] == 0 and fast[-1] == len(costs)
    assert all(a < b for a, b in zip(fast, fast[1:]))
    best = stage_times(costs, reference, weights).max()
    assert stage_times(costs, fast, weights).max() == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_equal_costs_give_an_even_bottleneck():
    costs = np.ones(10)
    assert stage_times(costs, split_layers(costs, 4)).max() == stage_times(costs, even_boundaries(10, 4)).max() == 3


def test_a_twice_as_fast_device_takes_twice_the_layers():
    assert split_layers(np.ones(12), 2, weights=[2.0, 1.0]) == (0, 8, 12)
    assert split_layers(np.ones(12), 2, weights=[1.0, 2.0]) == (0, 4, 12)
    assert split_layers(np.ones(12), 3, weights=[1.0, 1.0, 2.0]) == (0, 3, 6, 12)


def test_an_expensive_layer_gets_a_stage_of_its_own():
    costs = [1, 1, 10, 1, 1, 1]
    cuts = split_layers(costs, 3)
    assert stage_times(costs, cuts).max() == 10
    assert (2, 3) in list(zip(cuts, cuts[1:]))


def test_split_by_parameter_count_of_a_real_model():
    model = load_model_spec("tiny", ModelOptions(n_layer=6))
    costs = layer_costs(model, by="params")
    assert costs.tolist() == model.layer_parameter_counts().tolist()
    cuts = split_layers(costs, 3)
    assert stage_times(costs, cuts).max() <= stage_times(costs, even_boundaries(model.n_layers, 3)).max()


def test_measured_layer_times_are_positive_per_layer():
    model = load_model_spec("tiny", ModelOptions(n_layer=2))
    seconds = measure_layer_times(model, batch=2, seq_len=16, repeats=1)
    assert seconds.shape == (model.n_layers,) and np.all(seconds > 0)
    assert all(p.grad is None for p in model.as_module().parameters())


def test_stage_speed_is_the_slowest_replica():
    assert stage_speeds([[0, 1], [2, 3]], [1.0, 4.0, 2.0, 3.0]).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("costs, stages, weights, message", [
    ([1, 2], 3, None, "cannot cut 2 layers into 3 stages"),
    ([1, -1], 1, None, "finite and >= 0"),
    ([1, 2], 2, [1.0], "2 finite speeds > 0"),
    ([1, 2], 2, [1.0, 0.0], "2 finite speeds > 0"),
])
def test_bad_split_inputs_are_refused(costs, stages, weights, message):
    with pytest.raises(LayerModelError, match=message):
        split_layers(costs, stages, weights)

