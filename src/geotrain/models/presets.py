"""The TinyGPT presets, by `--model` name: one table for the runtime (`geotrain train`, benches) and
the in-process simulator / compression demo. Every preset reads 44 characters with a context of 96.

    name          layers  heads  d_model  MLP   parameters
    tiny-2layer   2       4      128      2x      288,768   the compression demo's model (at most 2 stages)
    tiny          4       4      128      4x      816,896   geotrain train's default (up to 4 stages)
    small         4       8      256      4x    3,206,656   bandwidth-bound on slow links
"""

from __future__ import annotations

from geotrain.models.gpt import GPTConfig

TINY_2LAYER_GPT = GPTConfig(mlp_ratio=2)
"""The compression demo's model (`--model tiny-2layer`): 2 layers, 4 heads, d_model 128, MLP 256 wide,
context 96, 44 characters (288,768 parameters).

Why so small: the demo trains 11 models for 300 steps on a 2-core CPU. At equal compute a wider,
shallower model learns faster in 300 steps (measured, AdamW: 2 x 128 reaches 1.72 bits per
character, 4 x 64 only 2.61, 4 x 128 1.77 at twice the cost), and a 2x MLP costs 22 % less than
a 4x one for 1.73 instead of 1.72. Pipelines wanting more stages pass n_layer."""

TINY_GPT = GPTConfig(n_layer=4)
"""geotrain train's default model (`--model tiny`): 4 layers (so up to 4 stages), 4 heads, d_model 128,
a 4x MLP (512 wide), context 96, 44 characters: 816,896 parameters."""

SMALL_GPT = GPTConfig(n_layer=4, n_head=8, d_model=256)
"""A bandwidth-bound model for slow links (`--model small`, geotrain bench wan --model small): the
tiny GPT at twice the width, 4 layers, 8 heads, d_model 256, context 96: 3,206,656 parameters
(12.8 MB of fp32 gradients)."""

MODEL_PRESETS: dict[str, GPTConfig] = {
    "tiny": TINY_GPT,
    "tiny-2layer": TINY_2LAYER_GPT,
    "small": SMALL_GPT,
}
"""`--model` name -> GPTConfig (see the module docstring's table)."""
