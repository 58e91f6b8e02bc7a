"""1-bit Adam as an update rule of the in-process training loop (`geotrain.sim.train_compressed`).

    result = train_compressed(config, update_rule=onebit_update_rule(warmup_steps=20))

The rule replaces the loop's exchange-then-step: the p simulated workers' gradients go straight
into OneBitAdam, which averages them itself (fp32 during warm-up, 1-bit momenta afterwards).
The loop's config supplies workers, peak lr (set per step by the loop's schedule), betas, weight
decay and clip_norm (OneBitAdam's max_grad_norm). Bytes returned per step are summed over workers,
as the loop's codec exchange counts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.codecs import parse_count
from geotrain.comm import SimulatedCollective
from geotrain.optim.onebit_adam import OneBitAdam, OneBitAdamError, finite_number


class OneBitAdamRule:
    """`step(worker_grads, lr, step) -> bytes sent by all workers` around a simulated OneBitAdam."""

    def __init__(self, optimizer: OneBitAdam) -> None:
        self.optimizer = optimizer

    def step(self, worker_grads: Sequence[torch.Tensor], lr: float, step: int) -> int:
        lr = finite_number(lr, "lr (set by the training loop's schedule)", low=0.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        before = self.optimizer.ledger.handed_bytes
        self.optimizer.step_workers(worker_grads)
        return (self.optimizer.ledger.handed_bytes - before) * self.optimizer.collective.world_size


@dataclass(frozen=True)
class OneBitAdamRuleFactory:
    """`(model, config) -> OneBitAdamRule` for train_compressed's `update_rule` (picklable, so it
    also works in geotrain.sim's process pool). `warmup_steps` None: `warmup_fraction` of the
    run's steps (at least 1), so one spec serves runs of any length."""

    warmup_steps: int | None = None
    warmup_fraction: float = 0.05
    variance_floor: float = 0.1
    clip_local: bool = False
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.warmup_steps is not None:
            parse_count(self.warmup_steps, "OneBitAdam rule: warmup_steps", minimum=1, error=OneBitAdamError)
        finite_number(self.warmup_fraction, "warmup_fraction", low=0.0, high=1.0, low_open=True)
        # variance_floor, clip_local and eps are checked by OneBitAdam itself when the rule is built.

    def warmup_for(self, steps: int) -> int:
        if self.warmup_steps is not None:
            return self.warmup_steps
        return max(1, round(self.warmup_fraction * steps))

    def __call__(self, model: torch.nn.Module, config: Any) -> OneBitAdamRule:
        optimizer = OneBitAdam(model.parameters(), lr=config.peak_lr, betas=tuple(config.betas), eps=self.eps,
                               weight_decay=config.weight_decay, warmup_steps=self.warmup_for(config.steps),
                               collective=SimulatedCollective(config.workers), max_grad_norm=config.clip_norm,
                               clip_local=self.clip_local, variance_floor=self.variance_floor)
        return OneBitAdamRule(optimizer)


def onebit_update_rule(warmup_steps: int | None = None, **options: Any) -> OneBitAdamRuleFactory:
    """The update rule factory for train_compressed: OneBitAdam with `warmup_steps` fp32 steps
    (default: 5% of the run); `options` are OneBitAdamRuleFactory's other fields."""
    return OneBitAdamRuleFactory(warmup_steps, **options)
