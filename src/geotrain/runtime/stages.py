"""Pipeline stages of the tiny GPT: contiguous blocks, the embedding on stage 0, the head + loss on the last.

Every worker builds the full model from the same seed (so all replicas start identical and the split
is exactly the unsplit model) and keeps only its stage's modules. The schedule sees a stage through
the small `Stage` interface, so it works for any model cut this way.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from geotrain.models import GPTConfig, TinyGPT, make_model
from geotrain.runtime.layout import LayoutError, layer_ranges


class Stage(Protocol):
    """What the pipeline schedule needs from a stage."""

    is_first: bool
    is_last: bool

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        """Stage 0: token ids (B, T) -> hidden; middle: hidden -> hidden; last: hidden -> logits."""
        ...

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss of the last stage's outputs (scalar)."""
        ...

    def activation_shape(self, batch: int, seq_len: int) -> tuple[int, ...]:
        """Shape of the hidden state that crosses a stage cut for `batch` sequences of `seq_len` tokens."""
        ...

    def parameters(self) -> object: ...


class GPTStage(nn.Module):
    """Blocks [start, stop) of a TinyGPT, plus its embedding (first stage) and head (last stage)."""

    def __init__(self, model: TinyGPT, stage: int, stages: int) -> None:
        super().__init__()
        if not 0 <= stage < stages:
            raise LayoutError(f"stage {stage} outside 0..{stages - 1}")
        if model.config.tie_weights and stages > 1:
            raise LayoutError("a model with tied embedding/head weights cannot be split into pipeline stages")
        self.config: GPTConfig = model.config
        self.stage, self.stages = stage, stages
        self.is_first, self.is_last = stage == 0, stage == stages - 1
        start, stop = layer_ranges(model.config.n_layer, stages)[stage]
        self.block_range = (start, stop)
        self.embed = model.embed if self.is_first else None
        self.blocks = nn.ModuleList(model.blocks[start:stop])
        self.head = model.head if self.is_last else None

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(inputs) if self.embed is not None else inputs
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden) if self.head is not None else hidden

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, 1), targets.flatten())

    def activation_shape(self, batch: int, seq_len: int) -> tuple[int, ...]:
        return (batch, seq_len, self.config.d_model)


def split_model(model: TinyGPT, stages: int) -> list[GPTStage]:
    """All stages of `model` (sharing its modules); composing them in order is model.forward."""
    return [GPTStage(model, stage, stages) for stage in range(stages)]


def build_stage(config: GPTConfig, seed: int, stage: int, stages: int) -> GPTStage:
    """Stage `stage` of the model make_model(config, seed) would build."""
    return GPTStage(make_model(config, seed), stage, stages)
