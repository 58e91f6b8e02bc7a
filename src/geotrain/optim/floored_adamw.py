"""AdamW with OneBitAdam's variance floor (and optionally its frozen variance), to separate its effects.

OneBitAdam differs from AdamW in three ways: (1) a per-tensor floor on sqrt(v) at the freeze
(`variance_floor` x the tensor's mean sqrt(v)), which acts like a large, per-tensor epsilon; (2) the
variance frozen after the warm-up; (3) 1-bit error-compensated momentum averaging. `FlooredAdamW`
isolates (1) and (2) with exact (fp32) gradient averaging:

    update = m_hat / (max(sqrt(v_hat), floor_t) + eps),   floor_t = variance_floor x mean(sqrt(v_hat)) of tensor t

recomputed every step (`freeze_after` None), or with v_hat and the floor frozen after `freeze_after`
steps exactly as OneBitAdam freezes them. variance_floor 0 and freeze_after None is AdamW.
`flooring_rule(...)` makes it an update rule of geotrain.sim's loop (exchange fp32, clip, step).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch


class FlooredAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) whose per-tensor denominator is floored (see the module doc)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, variance_floor: float = 0.1,
                 freeze_after: int | None = None) -> None:
        if not 0.0 <= variance_floor <= 1.0:
            raise ValueError(f"variance_floor must be in [0, 1], got {variance_floor!r}")
        if freeze_after is not None and freeze_after < 1:
            raise ValueError(f"freeze_after must be >= 1 or None, got {freeze_after!r}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})
        self.variance_floor = variance_floor
        self.freeze_after = freeze_after
        self.step_count = 0

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.step_count += 1
        frozen = self.freeze_after is not None and self.step_count > self.freeze_after
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                m = state["exp_avg"].lerp_(param.grad, 1 - beta1)
                if not frozen:
                    v = state["exp_avg_sq"].mul_(beta2).addcmul_(param.grad, param.grad, value=1 - beta2)
                    root = (v / (1 - beta2 ** self.step_count)).sqrt_()
                    floor = float(root.mean()) * self.variance_floor
                    state["denom"] = root.clamp_(min=floor)  # kept: the frozen denominator after freeze_after
                if group["weight_decay"]:
                    param.mul_(1 - group["lr"] * group["weight_decay"])
                param.addcdiv_(m, state["denom"] + group["eps"], value=-group["lr"] / (1 - beta1 ** self.step_count))


@dataclass(frozen=True)
class FlooredAdamWRuleFactory:
    """`(model, config) -> update rule`: fp32 exchange, clipping, FlooredAdamW (picklable).
    `freeze_fraction`: freeze after that fraction of the run's steps (OneBitAdam's warm-up rule), None: never."""

    variance_floor: float = 0.1
    freeze_fraction: float | None = None

    def __call__(self, model: torch.nn.Module, config: Any) -> Any:
        from geotrain.sim import ExchangeThenStep
        from geotrain.sim.exchange import GradientExchange

        params = list(model.parameters())
        freeze = None if self.freeze_fraction is None else max(1, round(self.freeze_fraction * config.steps))
        optimizer = FlooredAdamW(params, lr=config.peak_lr, betas=tuple(config.betas),
                                 weight_decay=config.weight_decay, variance_floor=self.variance_floor,
                                 freeze_after=freeze)
        exchange = GradientExchange("none", [(name, p.shape) for name, p in model.named_parameters()], config.workers)
        return ExchangeThenStep(params, exchange, optimizer, config.clip_norm)


def flooring_rule(variance_floor: float = 0.1, freeze_fraction: float | None = None) -> FlooredAdamWRuleFactory:
    """The update rule factory of FlooredAdamW for geotrain.sim.train_compressed."""
    return FlooredAdamWRuleFactory(variance_floor, freeze_fraction)
