"""Simulated data-parallel training in one process: p workers, each with a shard of every batch.

Per step: (a) each worker's flat gradient on its shard (`worker_gradients`), (b)+(c) an update rule
exchanges them and steps the optimizer (`ExchangeThenStep` by default). Same config, same data ->
same losses and bits per character, bit for bit (on the same machine and thread count).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from geotrain.codecs import CodecError, NonFiniteGradientError
from geotrain.data import WorldTokens, get_batch, world_tokens
from geotrain.models import TinyGPT, bits_per_char, lr_at, make_model
from geotrain.sim.config import TrainConfig, TrainingConfigError, TrainingResult
from geotrain.sim.exchange import GradientExchange
from geotrain.sim.update import ExchangeThenStep, UpdateRule, make_optimizer

UpdateRuleFactory = Callable[[TinyGPT, TrainConfig], UpdateRule]
ProgressCallback = Callable[[float, float], None]


def worker_gradients(model: nn.Module, params: Sequence[nn.Parameter], x: torch.Tensor, y: torch.Tensor,
                     workers: int) -> tuple[list[torch.Tensor], list[float]]:
    """Each worker's flat gradient of its mean cross-entropy on rows [r*b, (r+1)*b) of the batch, and its loss.

    The mean of the workers' gradients equals the gradient of the whole batch's mean loss.
    """
    shard = x.shape[0] // workers
    grads, losses = [], []
    for rank in range(workers):
        rows = slice(rank * shard, (rank + 1) * shard)
        logits = model(x[rows])
        loss = F.cross_entropy(logits.flatten(0, 1), y[rows].flatten())
        parts = torch.autograd.grad(loss, params)
        grads.append(torch.cat([part.reshape(-1) for part in parts]))
        losses.append(loss.item())
    return grads, losses


def codec_update_rule(model: TinyGPT, config: TrainConfig) -> UpdateRule:
    """The seed's scheme: compressed gradient exchange (optionally with error feedback), clip, AdamW/SGD.

    The exchange is geotrain.comm's reducer of `config.codec` (`powersgd`: distributed PowerSGD per
    parameter matrix, codec_params PowerSGDConfig fields), as in the DDP hooks and the runtime."""
    params = list(model.parameters())
    try:
        exchange = GradientExchange(config.codec, [(name, p.shape) for name, p in model.named_parameters()],
                                    config.workers, config.error_feedback, **dict(config.codec_params))
    except (CodecError, TypeError) as exc:
        raise TrainingConfigError(f"codec {config.codec!r}: {exc}") from exc
    return ExchangeThenStep(params, exchange, make_optimizer(params, config), config.clip_norm)


def train_compressed(config: TrainConfig, data: WorldTokens | None = None,
                     update_rule: UpdateRuleFactory = codec_update_rule,
                     progress: ProgressCallback | None = None) -> TrainingResult:
    """Train a fresh model for config.steps steps and score it on the validation text.

    `data`: the world's tokens (default: world_tokens(0)). `update_rule`: builds the optimizer side
    from the model and config. `progress(done, total)` is called after every step. If a loss or a
    gradient becomes NaN/inf, training stops and `diverged_at_step` says when.
    """
    data = world_tokens(0) if data is None else data
    if config.model.vocab_size != data.vocab_size:
        raise TrainingConfigError(f"model vocab_size={config.model.vocab_size} but the data has {data.vocab_size} symbols")
    started = time.perf_counter()
    model = make_model(config.model, seed=config.seed)
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    rule = update_rule(model, config)
    generator = torch.Generator().manual_seed(config.seed + 1)
    losses: list[float] = []
    total_bytes = 0
    diverged_at: int | None = None
    for step in range(config.steps):
        x, y = get_batch(data.train, config.batch, config.model.context, generator)
        grads, worker_losses = worker_gradients(model, params, x, y, config.workers)
        loss = sum(worker_losses) / len(worker_losses)
        losses.append(loss)
        if not math.isfinite(loss):
            diverged_at = step
            break
        lr = lr_at(step, config.steps, config.peak_lr, config.warmup_steps)
        try:
            total_bytes += rule.step(grads, lr, step)
        except NonFiniteGradientError:
            diverged_at = step
            break
        if progress is not None:
            progress(step + 1, config.steps)
    steps_done = len(losses) - (diverged_at is not None)
    bytes_per_value = total_bytes / (max(steps_done, 1) * config.workers * n_params)
    return TrainingResult(val_bpc=bits_per_char(model, data.val), bytes_per_value=bytes_per_value,
                          total_bytes_sent=total_bytes, losses=tuple(losses), n_params=n_params,
                          workers=config.workers, seconds=time.perf_counter() - started,
                          diverged_at_step=diverged_at)
