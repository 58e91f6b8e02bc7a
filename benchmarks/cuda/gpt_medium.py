"""A GPT-2-small-shaped model for the CUDA check (`--model benchmarks/cuda/gpt_medium.py:gpt_medium`):
12 layers, 12 heads, d_model 768, context 512, the synthetic data's 44-character vocabulary
(85.5 M parameters; its weights come from make_model's own seed 0). Big enough that a step on one GPU is
kernel time, not launch overhead."""

from __future__ import annotations

from geotrain.models.gpt import GPTConfig, make_model
from geotrain.models.layers import LayerModel

CONFIG = GPTConfig(context=512, n_layer=12, n_head=12, d_model=768)


def gpt_medium() -> LayerModel:
    """The layer list [embedding, 12 blocks, head] of CONFIG, seeded as the spec loader seeds it."""
    model = make_model(CONFIG)
    return LayerModel("gpt-medium", (model.embed, *model.blocks, model.head), CONFIG.vocab_size,
                      CONFIG.context, CONFIG.d_model)
