"""One table of TinyGPT presets: the runtime, the simulator and load_model_spec read the same models."""

from __future__ import annotations

import pytest

from geotrain.models import (
    MODEL_PRESETS,
    SMALL_GPT,
    TINY_2LAYER_GPT,
    TINY_GPT,
    ModelOptions,
    TinyGPT,
    load_model_spec,
)
from geotrain.models import presets
from geotrain.runtime.stages import build_layer_model
from geotrain.sim import TrainConfig


@pytest.mark.parametrize(("name", "layers", "mlp_ratio", "d_model", "params"), [
    ("tiny", 4, 4, 128, 816_896),
    ("tiny-2layer", 2, 2, 128, 288_768),
    ("small", 4, 4, 256, 3_206_656),
])
def test_each_preset_has_the_shape_and_parameter_count_its_docstring_states(name, layers, mlp_ratio, d_model, params):
    config = MODEL_PRESETS[name]
    assert (config.n_layer, config.mlp_ratio, config.d_model, config.vocab_size, config.context) == (
        layers, mlp_ratio, d_model, 44, 96)
    assert TinyGPT(config).num_parameters() == params
    assert f"{params:,}" in presets.__doc__


def test_the_table_names_the_constants():
    assert MODEL_PRESETS == {"tiny": TINY_GPT, "tiny-2layer": TINY_2LAYER_GPT, "small": SMALL_GPT}


def test_the_simulator_trains_the_2layer_preset_by_default():
    assert TrainConfig().model is MODEL_PRESETS["tiny-2layer"]


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_load_model_spec_and_the_runtime_build_the_same_preset(name):
    spec = load_model_spec(name, ModelOptions(seed=3))
    runtime = build_layer_model(name, MODEL_PRESETS, seed=3, data_vocab=None)
    assert spec.n_layers == runtime.n_layers == MODEL_PRESETS[name].n_layer + 2
    assert spec.num_parameters() == runtime.num_parameters() == TinyGPT(MODEL_PRESETS[name]).num_parameters()
    assert all((a == b).all() for a, b in zip(spec.as_module().parameters(), runtime.as_module().parameters()))
