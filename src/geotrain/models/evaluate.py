"""Validation quality: bits per character (tiny GPT), mean loss in nats over a held-out split (any layer model)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from geotrain.models.layers import lm_loss, run_layers


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


def validation_starts(n_tokens: int, seq_len: int, max_windows: int | None = None) -> np.ndarray:
    """Start offsets (int64) of the validation windows of seq_len + 1 tokens: non-overlapping from the
    start, or `max_windows` of them spread evenly over the split."""
    n_windows = (n_tokens - 1) // seq_len if seq_len >= 1 else 0
    if n_windows < 1:
        raise ValueError(f"need at least seq_len + 1 = {seq_len + 1} validation tokens, got {n_tokens}")
    starts = np.arange(n_windows, dtype=np.int64) * seq_len
    if max_windows is not None and max_windows < n_windows:
        starts = starts[np.linspace(0, n_windows - 1, max_windows).round().astype(np.int64)]
    return starts


def validation_loss(model: nn.Module | Sequence[nn.Module], tokens: np.ndarray | torch.Tensor, seq_len: int,
                    batch_size: int = 16, max_windows: int | None = None) -> float:
    """Mean next-token cross-entropy in nats over held-out `tokens` (1-D ids) for a model or a list of stages.

    Scores non-overlapping windows of seq_len + 1 tokens from the start (a last, shorter remainder is
    skipped); with `max_windows`, that many windows spread evenly over the split. Eval mode, no
    gradients, deterministic. `model` may be one module or stages run in sequence (unsplit evaluation).
    """
    stages = list(model) if isinstance(model, (list, tuple)) else [model]
    starts = validation_starts(len(tokens), seq_len, max_windows)
    device = next((p.device for m in stages for p in m.parameters()), torch.device("cpu"))
    modes = [m.training for m in stages]
    total, count = 0.0, 0
    try:
        for m in stages:
            m.eval()
        with torch.no_grad():
            for i in range(0, len(starts), batch_size):
                offsets = starts[i:i + batch_size, None] + np.arange(seq_len + 1)
                windows = torch.from_numpy(np.asarray(tokens)[offsets].astype(np.int64)).to(device)
                logits = run_layers(stages, windows[:, :-1])
                total += lm_loss(logits, windows[:, 1:]).item() * windows[:, 1:].numel()
                count += windows[:, 1:].numel()
    finally:
        for m, mode in zip(stages, modes):
            m.train(mode)
    return total / count
