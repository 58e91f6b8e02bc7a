"""Validation quality in bits per character."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def bits_per_char(model: nn.Module, tokens: torch.Tensor, context: int | None = None, batch_size: int = 64) -> float:
    """Mean cross-entropy in bits of predicting each next token of `tokens` (1-D int64).

    The text is cut into consecutive, non-overlapping windows of `context` predictions (the model's
    context by default); every token after the first is predicted exactly once. Deterministic: no
    sampling, eval mode, no gradients.
    """
    context = context or model.config.context
    n_targets = tokens.numel() - 1
    if n_targets < 1:
        raise ValueError(f"need at least 2 tokens to score, got {tokens.numel()}")
    starts = list(range(0, n_targets, context))
    was_training = model.training
    model.eval()
    total_nats = 0.0
    try:
        with torch.no_grad():
            full = [s for s in starts if s + context <= n_targets]
            for i in range(0, len(full), batch_size):
                offsets = torch.tensor(full[i:i + batch_size])[:, None] + torch.arange(context + 1)
                windows = tokens[offsets]
                logits = model(windows[:, :-1])
                total_nats += F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten(), reduction="sum").item()
            if len(full) < len(starts):  # the last, shorter window
                tail = tokens[starts[-1]:]
                logits = model(tail[None, :-1])
                total_nats += F.cross_entropy(logits[0], tail[1:], reduction="sum").item()
    finally:
        model.train(was_training)
    return total_nats / (n_targets * math.log(2))
