"""A tiny character-level GPT, its validation metric (bits per character) and its learning-rate schedule."""

from geotrain.models.evaluate import bits_per_char
from geotrain.models.gpt import BASE_CONFIG, Block, GPTConfig, ModelConfigError, TinyGPT, make_model
from geotrain.models.schedule import lr_at

__all__ = [
    "BASE_CONFIG",
    "Block",
    "GPTConfig",
    "ModelConfigError",
    "TinyGPT",
    "bits_per_char",
    "lr_at",
    "make_model",
]
