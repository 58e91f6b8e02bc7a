"""A tiny character-level GPT (pre-norm transformer), split into parts a pipeline can cut:

    hidden = model.embed(idx)          # token + position embeddings, (B, T, d_model)
    for block in model.blocks:         # nn.ModuleList; each block maps (B, T, d) -> (B, T, d)
        hidden = block(hidden)
    logits = model.head(hidden)        # final LayerNorm + LM head, (B, T, vocab_size)

Weights are not tied between embedding and head by default (tying would couple the first and the
last pipeline stage); `tie_weights=True` turns it on for single-process use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from geotrain.errors import GeotrainError


class ModelConfigError(GeotrainError, ValueError):
    """A GPTConfig field is out of range."""


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model. `context` is the longest sequence in tokens."""

    vocab_size: int = 44
    context: int = 96
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    mlp_ratio: int = 4
    tie_weights: bool = False
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "n_layer", "n_head", "d_model", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ModelConfigError(f"GPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise ModelConfigError(f"GPTConfig.d_model={self.d_model} must be divisible by n_head={self.n_head}")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, time, self.n_head, dim // self.n_head).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, time, dim))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, config.mlp_ratio * config.d_model), nn.GELU(),
                                 nn.Linear(config.mlp_ratio * config.d_model, config.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Module):
    """Token + learned position embeddings."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.context = config.context
        self.token = nn.Embedding(config.vocab_size, config.d_model)
        self.position = nn.Embedding(config.context, config.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.shape[-1] > self.context:
            raise ModelConfigError(f"sequence of {idx.shape[-1]} tokens is longer than the context {self.context}")
        return self.token(idx) + self.position(torch.arange(idx.shape[-1], device=idx.device))


class Head(nn.Module):
    """Final LayerNorm + linear map to vocabulary logits (no bias)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(config.d_model)
        self.lm = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm(self.ln(hidden))


class TinyGPT(nn.Module):
    """forward(idx) = head(blocks(embed(idx))): int64 (B, T) -> float logits (B, T, vocab_size)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = Embedding(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.head = Head(config)
        self._tie()

    def _tie(self) -> None:
        if self.config.tie_weights:
            self.head.lm.weight = self.embed.token.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(idx)
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def make_model(config: GPTConfig, seed: int = 0) -> TinyGPT:
    """A TinyGPT on CPU with weights drawn from a private generator seeded by `seed` (global RNG untouched).

    Linear and embedding weights ~ N(0, init_std); residual output projections scaled by
    1/sqrt(2 n_layer) (GPT-2); biases 0; LayerNorms 1 and 0.
    """
    with torch.device("meta"):  # no default initialisation: it would draw from the global RNG
        model = TinyGPT(config)
    model = model.to_empty(device="cpu")
    model._tie()  # to_empty gives every parameter its own storage
    generator = torch.Generator().manual_seed(seed)
    residual_std = config.init_std / math.sqrt(2 * config.n_layer)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif ".ln" in name or name.startswith("head.ln"):
                param.fill_(1.0)
            else:
                std = residual_std if name.endswith(("attn.proj.weight", "mlp.2.weight")) else config.init_std
                param.normal_(0.0, std, generator=generator)
    return model
