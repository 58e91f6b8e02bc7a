"""How far AdamW can move a parameter when its gradients carry rounding error: a per-element bound
for tests that compare a distributed run's weights with an in-process reference.

Two machines (or two SIMD widths, or two reduction orders) compute the same gradient g to within a
rounding error e. AdamW's step is lr x m_hat / (sqrt(v_hat) + eps), whose derivative with respect to
the step's gradient is at most (1 - b1) / bc1 + (1 - b2) |g| |m_hat| / (bc2 sqrt(v_hat) (sqrt(v_hat) + eps))
<= 2 over (sqrt(v_hat) + eps). So the step moves by at most

    lr_t x min(2, 2 |e| / (sqrt(v_hat_t) + eps))

per element (2 lr_t: the step's own bound, a sign flip of a near-zero gradient), and the differences
of successive steps add up (weight decay only shrinks them). Where v_hat is small, a last-bit
gradient difference moves the parameter by up to 2 lr: a fixed tolerance is either loose or fragile.

The gradient error |e| is taken as GRAD_RELATIVE_ERROR x the tensor's largest |gradient|. A float32
dot product over k terms errs by up to k u sum|terms| (u = 2^-24); the gradients here sum over
k ~ 10^3 terms (tokens x features), and the error also carries the previous steps' parameter
differences into the gradient, so 2^-10 (~1e-3, about 10x the worst seen between AVX-512 and
plain-C kernels, ATEN_CPU_CAPABILITY=default) is the bound. A real bug, such as a missing average,
moves most elements by ~lr and fails it.
"""

from __future__ import annotations

import torch

GRAD_RELATIVE_ERROR = 2.0 ** -10


class AdamWDrift:
    """Accumulates the per-element bound over the AdamW steps of `optimizer` (call `after_step` right after
    each `optimizer.step()`, while the parameters' .grad still hold the step's gradients)."""

    def __init__(self, optimizer: torch.optim.Optimizer, relative_error: float = GRAD_RELATIVE_ERROR) -> None:
        self.optimizer = optimizer
        self.relative_error = relative_error
        self.bounds: dict[torch.nn.Parameter, torch.Tensor] = {}

    def after_step(self) -> None:
        for group in self.optimizer.param_groups:
            beta2, eps, lr = group["betas"][1], group["eps"], group["lr"]
            for p in group["params"]:
                state = self.optimizer.state[p]
                if p.grad is None or "exp_avg_sq" not in state:
                    continue
                step = float(state["step"])
                v_hat = state["exp_avg_sq"].double() / (1.0 - beta2 ** step)
                error = self.relative_error * float(p.grad.abs().max())
                move = lr * torch.clamp(2.0 * error / (v_hat.sqrt() + eps), max=2.0)
                self.bounds[p] = self.bounds.get(p, torch.zeros_like(move)) + move

    def bound(self, parameter: torch.nn.Parameter) -> torch.Tensor:
        """The accumulated per-element bound of `parameter` (float64, its shape)."""
        return self.bounds[parameter]


def worst_excess(value: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> float:
    """max(|value - expected| / bound): <= 1 when every element is within its bound."""
    return float(((value.double() - expected.double()).abs() / bound.clamp(min=1e-30)).max())
