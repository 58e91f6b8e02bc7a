"""Models: geotrain's tiny GPT and its presets (MODEL_PRESETS), and every model as a layer list a
pipeline cuts into stages.

`load_model_spec(spec, ModelOptions(...))` resolves a preset (tiny, tiny-2layer, small) | hf:... | file.py:fn | pkg.mod:fn to a
LayerModel; `split_layers` cuts it by cost and device speed; `stage_ties` + `sum_tied_gradients` /
`all_reduce_tied_gradients` keep tied weights tied across stages; `lm_loss` is the shared loss.
"""

from geotrain.models.evaluate import bits_per_char, validation_loss, validation_starts
from geotrain.models.gpt import Block, GPTConfig, ModelConfigError, TinyGPT, make_model
from geotrain.models.layer_costs import layer_costs, measure_layer_times
from geotrain.models.layers import (
    LayerModel,
    LayerModelError,
    TiedWeight,
    check_boundaries,
    even_boundaries,
    find_tied_weights,
    lm_loss,
    run_layers,
)
from geotrain.models.options import ModelOptions, ModelSpecError
from geotrain.models.presets import MODEL_PRESETS, SMALL_GPT, TINY_2LAYER_GPT, TINY_GPT
from geotrain.models.schedule import lr_at
from geotrain.models.spec import load_model_spec
from geotrain.models.split import split_layers, split_layers_reference, stage_speeds, stage_times
from geotrain.models.tied import StageTie, all_reduce_tied_gradients, stage_ties, sum_tied_gradients

__all__ = [
    "Block",
    "GPTConfig",
    "MODEL_PRESETS",
    "LayerModel",
    "LayerModelError",
    "ModelConfigError",
    "ModelOptions",
    "ModelSpecError",
    "SMALL_GPT",
    "StageTie",
    "TiedWeight",
    "TINY_2LAYER_GPT",
    "TINY_GPT",
    "TinyGPT",
    "all_reduce_tied_gradients",
    "bits_per_char",
    "check_boundaries",
    "even_boundaries",
    "find_tied_weights",
    "layer_costs",
    "lm_loss",
    "load_model_spec",
    "lr_at",
    "make_model",
    "measure_layer_times",
    "run_layers",
    "split_layers",
    "split_layers_reference",
    "stage_speeds",
    "stage_ties",
    "stage_times",
    "sum_tied_gradients",
    "validation_loss",
    "validation_starts",
]
