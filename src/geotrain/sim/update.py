"""The optimizer side of a training step: from the workers' gradients to updated parameters.

An update rule is `step(worker_grads, lr, step) -> bytes sent`. `ExchangeThenStep` is plain data
parallelism: exchange (compressed) gradients, clip the aggregate, then a torch optimizer step. An
optimizer that does its own compressed exchange (1-bit Adam) is another update rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from geotrain.comm.clip import clip_grad_norm_
from geotrain.sim.config import TrainConfig
from geotrain.sim.exchange import GradientExchange


class UpdateRule(Protocol):
    def step(self, worker_grads: Sequence[torch.Tensor], lr: float, step: int) -> int:
        """Update the parameters from the workers' flat gradients at learning rate `lr`; return wire bytes sent."""
        ...


def make_optimizer(params: Sequence[nn.Parameter], config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW (betas, decoupled weight decay) or SGD with momentum, at the config's peak lr."""
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=config.peak_lr, betas=config.betas, weight_decay=config.weight_decay)
    return torch.optim.SGD(params, lr=config.peak_lr, momentum=config.momentum)


def assign_flat_grad(params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
    """Set each parameter's .grad to its slice of `flat` (parameters in order, flattened)."""
    offset = 0
    for param in params:
        n = param.numel()
        param.grad = flat[offset:offset + n].view_as(param)
        offset += n
    if offset != flat.numel():
        raise ValueError(f"flat gradient has {flat.numel()} values, the parameters {offset}")


class ExchangeThenStep:
    """Exchange the workers' gradients, clip the aggregate to `clip_norm` (None: off), step `optimizer`."""

    def __init__(self, params: Sequence[nn.Parameter], exchange: GradientExchange,
                 optimizer: torch.optim.Optimizer, clip_norm: float | None) -> None:
        self.params = list(params)
        self.exchange = exchange
        self.optimizer = optimizer
        self.clip_norm = clip_norm

    def step(self, worker_grads: Sequence[torch.Tensor], lr: float, step: int) -> int:
        exchanged = self.exchange.exchange(worker_grads, step)
        gradient = exchanged.gradient
        if self.clip_norm is not None:
            clip_grad_norm_([gradient], self.clip_norm)
        assign_flat_grad(self.params, gradient)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        return exchanged.bytes_sent
