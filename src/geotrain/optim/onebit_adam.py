"""1-bit Adam (Tang et al. 2021, "1-bit Adam: Communication Efficient Large-Scale Training with
Adam's Convergence Speed"), as a torch.optim.Optimizer over a `Collective`.

Two stages:
1. Warm-up (`warmup_steps` steps): plain AdamW. Gradients are averaged in full precision
   (fp32 all-reduce); optional clipping of the averaged gradient to `max_grad_norm`.
2. Compression: the variance is frozen (its bias-corrected value at the end of the warm-up).
   Each worker updates its momentum with its *local* gradient, m_i = b1 m + (1 - b1) g_i, and the
   momenta are averaged by an error-compensated 1-bit all-reduce (geotrain.comm's `onebit` reducer:
   sign bits and per-segment scales, worker and server residuals), so every worker ends with the same m. The update is m_hat / (sqrt(v_frozen) + eps), plus
   decoupled weight decay. Clipping (`max_grad_norm`) applies to the averaged warm-up gradient
   only, unless `clip_local=True`: with the variance frozen the update is linear in the gradient, so
   clipping each worker's (noisier, longer) local gradient shrinks the step itself, not just its
   direction as Adam's normalisation would (measured on the tiny GPT: worse bpc).
The frozen variance turns Adam into a linear (momentum-SGD-like) update with a fixed per-value
learning rate, which is what makes error compensation work for it.

Variance floor (not in Tang et al.; `variance_floor`, default 0.1): at the freeze every value's
variance is raised to at least (variance_floor x its tensor's mean sqrt(v))^2. Without it, values
whose gradient was ~0 during the warm-up keep a frozen v ~ 0 and their update is divided by eps:
an embedding row of a character not yet seen, or the key bias of attention (softmax ignores it,
so its gradient is ~1e-12), which shares its 1-bit segment scale with the query and value biases
and so receives +-(their momentum) / 1e-12. Measured on the demo GPT (300 steps, 4 workers, 15
warm-up steps, 3 seeds): no floor 2.26-2.40 bpc, floor 0.01 2.27, floor 0.1 1.50-1.54, floor 0.3
1.53 (AdamW 1.67-1.76). Set it to 0 for the paper's algorithm.

Bytes per worker per step, handed to the process group: warm-up 4 n (one fp32 all-reduce);
compression (p + 1) x message_bytes ~ n/8 (1 + 1/p) (one all-to-all, one all-gather).
`ledger` (the collective's) counts them; `declared_step_bytes()` states them.

State (moments, frozen variance, worker and server residuals) lives on the parameters' device (one device for
all); the 1-bit messages are encoded there and travel through the collective (a TorchCollective with
`host_copies=True` hands host copies to gloo, as `geotrain train --device cuda` does; not yet run on a GPU).
A loaded state dict is moved to that device.

In one process with p simulated workers, call `step_workers([flat_grad_0, ..., flat_grad_p-1])`;
across processes, each rank calls `step()` after `backward()` (do not wrap the model in DDP: the
optimizer does the gradient communication itself). A step is `exchange_step` (the collectives, on this
optimizer's collective or a given one: no state changes) then `commit_step` (moments, residuals, step count,
parameters): a caller whose exchange may fail to commit (an elastic quorum: geotrain.sync.elastic_onebit)
drops the first and tries again.

Non-finite gradients (the codecs' policy): NaN/inf in any worker's gradient reaches every rank
through the collectives (the fp32 all-reduce; in the 1-bit stage through the poisoned segment's
scale), so every rank checks the averaged result and raises NonFiniteGradientError naming the
parameters, at the same step, before anything changes: moments, residuals, step count and
parameters stay bit for bit as they were (the new residuals are computed aside and committed only
after the check). No extra collective is needed. `allow_nonfinite=True` lets them through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import math
import numbers
from dataclasses import dataclass

import torch

from geotrain.codecs import NonFiniteGradientError, parse_count, parse_flag
from geotrain.comm import CommLedger, Collective, OneBitLayout, OneBitMomentumReducer, SimulatedCollective
from geotrain.comm.clip import clip_grad_norm_
from geotrain.comm.onebit import Residuals
from geotrain.errors import GeotrainError


class OneBitAdamError(GeotrainError, ValueError):
    """Bad OneBitAdam argument or incompatible state."""


@dataclass(frozen=True)
class OneBitExchanged:
    """What one step's exchange delivered (`OneBitAdam.exchange_step`): the averaged gradient (warm-up; `grad_norm`
    its norm before clipping, None without clipping) or the averaged momentum with the `reducer` it ran on and its
    new `residuals` (compression)."""

    averaged: torch.Tensor
    grad_norm: float | None = None
    reducer: OneBitMomentumReducer | None = None
    residuals: Residuals | None = None


class OneBitAdam(torch.optim.Optimizer):
    """AdamW warm-up, then frozen variance and 1-bit error-compensated momentum averaging.

    lr, betas, eps, weight_decay: as torch.optim.AdamW (weight decay is decoupled).
    warmup_steps: full-precision AdamW steps before the variance freezes (>= 1).
    collective: where the workers are (default: one simulated worker, i.e. plain single-process use).
    max_grad_norm: clip the averaged warm-up gradient to this L2 norm; None: off.
    norm_sum_squares: turns this process's squared gradient norm into the global one when the model is
        cut into stages (geotrain.comm.clip_grad_norm_'s `sum_squares`; None: this process has it all).
    clip_local: also clip each worker's local gradient to max_grad_norm after the freeze.
    variance_floor: lowest frozen sqrt(v) as a fraction of its tensor's mean sqrt(v) (0: none).
    allow_nonfinite: False (default, the codecs' policy) -> a step whose averaged gradient (warm-up)
        or averaged momentum (compression) holds NaN/inf raises NonFiniteGradientError naming the
        parameters, on every rank, before any state changes; True -> they propagate (old behaviour).
    Every argument is checked here (finite numbers in range, integer warmup_steps, two betas, strict
    flags): OneBitAdamError otherwise. Parameters may be given as `model.named_parameters()`, so
    that errors name them.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, warmup_steps: int = 100,
                 collective: Collective | None = None, max_grad_norm: float | None = None,
                 clip_local: bool = False, variance_floor: float = 0.1, allow_nonfinite: bool = False,
                 norm_sum_squares: Callable[[float], float] | None = None) -> None:
        _check_group_options({"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}, "")
        self.warmup_steps = parse_count(warmup_steps, "OneBitAdam: warmup_steps (the variance needs estimating)",
                                        minimum=1, error=OneBitAdamError)
        self.max_grad_norm = None if max_grad_norm is None else \
            finite_number(max_grad_norm, "max_grad_norm (or None: no clipping)", low=0.0, low_open=True)
        self.clip_local = parse_flag(clip_local, "OneBitAdam: clip_local", error=OneBitAdamError)
        self.allow_nonfinite = parse_flag(allow_nonfinite, "OneBitAdam: allow_nonfinite", error=OneBitAdamError)
        self.variance_floor = finite_number(variance_floor, "variance_floor", low=0.0, high=1.0)
        self.collective: Collective = _checked_collective(collective)
        self.norm_sum_squares = norm_sum_squares
        self.last_grad_norm: float | None = None  # of the averaged warm-up gradient, before clipping
        try:
            super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})
        except (TypeError, ValueError) as exc:  # torch's own checks of `params` (empty, not tensors...)
            raise OneBitAdamError(f"OneBitAdam: params: {exc}") from None
        for index, group in enumerate(self.param_groups):  # groups may override lr, eps, weight_decay
            _check_group_options(group, f"param_groups[{index}].")
        if len({tuple(group["betas"]) for group in self.param_groups}) > 1:
            raise OneBitAdamError("all parameter groups must share betas (one momentum is averaged for all)")
        self._params = [p for group in self.param_groups for p in group["params"]]
        self._param_names = [name for group in self.param_groups
                             for name in group.get("param_names", [None] * len(group["params"]))]
        if any(p.numel() == 0 for p in self._params) or not self._params:
            raise OneBitAdamError(f"OneBitAdam: every parameter needs at least one value, got sizes "
                                  f"{[p.numel() for p in self._params][:10]}")
        devices = sorted({str(p.device) for p in self._params})
        if len(devices) > 1:
            raise OneBitAdamError(f"OneBitAdam: every parameter must be on one device (its state lives there), "
                                  f"got {devices}")
        self.device = self._params[0].device
        self.reducer = OneBitMomentumReducer([p.numel() for p in self._params], self.collective.world_size,
                                             len(self.collective.local_ranks), self.device)
        n = self.layout.numel
        self.step_count = 0
        self.exp_avg = torch.zeros(n, device=self.device)
        self.exp_avg_sq = torch.zeros(n, device=self.device)  # after the freeze: the frozen, bias-corrected variance

    @property
    def layout(self) -> OneBitLayout:
        return self.reducer.layout

    @property
    def worker_errors(self) -> list[torch.Tensor]:
        return self.reducer.worker_errors

    @property
    def server_errors(self) -> list[torch.Tensor]:
        return self.reducer.server_errors

    @property
    def frozen(self) -> bool:
        return self.step_count >= self.warmup_steps

    @property
    def ledger(self) -> CommLedger:
        return self.collective.ledger

    def declared_step_bytes(self, compressed: bool) -> int:
        """Bytes one worker hands to the process group in one warm-up or one compressed step."""
        if not compressed:
            return 4 * self.layout.numel
        return self.reducer.step_bytes()

    def flat_grad(self) -> torch.Tensor:
        """This process's gradients as one flat float32 vector (missing gradients count as 0)."""
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float()
                          for p in self._params])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One step from this process's `.grad`s (needs a collective with exactly one local worker)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if len(self.collective.local_ranks) != 1:
            raise OneBitAdamError(f"step() uses this process's .grad, but the collective simulates "
                                  f"{len(self.collective.local_ranks)} workers: call step_workers(grads)")
        self.step_workers([self.flat_grad()])
        return loss

    @torch.no_grad()
    def step_workers(self, worker_grads: Sequence[torch.Tensor]) -> None:
        """One step from one flat (n,) gradient per local worker, in `collective.local_ranks` order."""
        self.commit_step(self.exchange_step(worker_grads))

    @torch.no_grad()
    def exchange_step(self, worker_grads: Sequence[torch.Tensor], collective: Collective | None = None,
                      reducer: OneBitMomentumReducer | None = None) -> OneBitExchanged:
        """The communication of one step (warm-up: the averaged gradient; compression: the averaged momentum and
        the new residuals) over `collective` with `reducer` (None: this optimizer's), changing no state; the step
        happens at `commit_step`. A caller whose exchange may not commit (an elastic quorum) drops it instead."""
        collective = self.collective if collective is None else collective
        reducer = self.reducer if reducer is None else reducer
        local = len(collective.local_ranks)
        if len(worker_grads) != local or any(not isinstance(g, torch.Tensor) or not g.is_floating_point()
                                             or g.numel() != self.layout.numel for g in worker_grads):
            got = [(g.numel(), str(g.dtype)) if isinstance(g, torch.Tensor) else type(g).__name__ for g in worker_grads]
            raise OneBitAdamError(f"need {local} flat float gradients of {self.layout.numel} values, got {got}")
        beta1, _ = self.param_groups[0]["betas"]
        if not self.frozen:
            grad = collective.all_reduce_mean([g.float() for g in worker_grads])
            self._refuse_nonfinite(grad, worker_grads, "the averaged gradient", collective.local_ranks)
            norm = None
            if self.max_grad_norm is not None:
                norm = clip_grad_norm_([grad], self.max_grad_norm, self.norm_sum_squares)
            return OneBitExchanged(grad, norm)
        local_norm = self.max_grad_norm if self.clip_local else None
        momenta = [torch.lerp(self.exp_avg, _clipped(g, local_norm), 1 - beta1) for g in worker_grads]
        averaged, residuals = reducer.average(momenta, collective)
        self._refuse_nonfinite(averaged, worker_grads, "the 1-bit averaged momentum", collective.local_ranks)
        return OneBitExchanged(averaged, None, reducer, residuals)

    @torch.no_grad()
    def commit_step(self, exchanged: OneBitExchanged) -> None:
        """The step of an `exchange_step`: moments, residuals (and the reducer it ran with), step count and
        parameters."""
        beta1, beta2 = self.param_groups[0]["betas"]
        if exchanged.reducer is None:
            grad = exchanged.averaged
            if self.max_grad_norm is not None:
                self.last_grad_norm = exchanged.grad_norm
            self.exp_avg.lerp_(grad, 1 - beta1)  # the same operations as torch.optim.AdamW, bit for bit
            self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            self.step_count += 1
            variance_correction = 1 - beta2 ** self.step_count
            if self.frozen:  # freeze the bias-corrected variance
                self.exp_avg_sq.div_(variance_correction)
                self._apply_variance_floor()
                variance_correction = 1.0
        else:
            self.exp_avg = exchanged.averaged
            self.reducer = exchanged.reducer
            self.reducer.commit(exchanged.residuals)
            self.step_count += 1
            variance_correction = 1.0
        self._apply_update(1 - beta1 ** self.step_count, variance_correction)

    def _refuse_nonfinite(self, averaged: torch.Tensor, worker_grads: Sequence[torch.Tensor], what: str,
                          local_ranks: Sequence[int]) -> None:
        """NonFiniteGradientError naming the parameters if `averaged` (the same on every rank: one
        worker's NaN reaches everyone through the collectives, so every rank refuses the same step)
        holds NaN/inf, unless allow_nonfinite. Called before any state changes."""
        if self.allow_nonfinite or bool(torch.isfinite(averaged).all()):
            return
        bad = (~torch.isfinite(averaged)).nonzero().reshape(-1).cpu()
        ends = torch.tensor([p.numel() for p in self._params]).cumsum(0)
        params = torch.unique(torch.searchsorted(ends, bad, right=True)).tolist()
        names = [self._param_names[i] or f"#{i} {tuple(self._params[i].shape)}" for i in params]
        local = [rank for rank, g in zip(local_ranks, worker_grads, strict=True)
                 if not bool(torch.isfinite(g).all())]
        source = f"non-finite gradient from local worker(s) {local}" if local else \
            "this process's gradients are finite (another rank sent NaN/inf, or the average overflowed)"
        shown = ", ".join(map(str, names[:5])) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise NonFiniteGradientError(
            f"OneBitAdam step {self.step_count + 1}: {what} holds {bad.numel()} NaN/inf value(s) in "
            f"parameter(s) {shown}; {source}. Step refused, optimizer state unchanged "
            f"(pass allow_nonfinite=True to let them through)")

    def _apply_variance_floor(self) -> None:
        """Raise each frozen variance to at least (variance_floor x its tensor's mean sqrt(v))^2."""
        if not self.variance_floor:
            return
        offset = 0
        for param in self._params:
            v = self.exp_avg_sq[offset: offset + param.numel()]
            offset += param.numel()
            floor = float(v.sqrt().mean()) * self.variance_floor
            v.clamp_(min=floor * floor)

    def _apply_update(self, momentum_correction: float, variance_correction: float) -> None:
        offset = 0
        for group in self.param_groups:
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            for param in group["params"]:
                n = param.numel()
                m = self.exp_avg[offset: offset + n].view_as(param)
                v = self.exp_avg_sq[offset: offset + n].view_as(param)
                offset += n
                if weight_decay:
                    param.mul_(1 - lr * weight_decay)
                denom = (v.sqrt() / variance_correction ** 0.5).add_(eps)
                param.addcdiv_(m, denom, value=-lr / momentum_correction)

    def _check_saved_tensors(self, onebit: dict[str, Any]) -> None:
        """Moments and residuals of a saved state must have this optimizer's sizes (checked before loading)."""
        local = len(self.collective.local_ranks)
        expected = [self.layout.numel] * 2 + [self.layout.padded_numel] * local + [self.layout.chunk_numel] * local
        found = _saved_sizes(onebit)
        if found != expected:
            raise OneBitAdamError(f"OneBitAdam state holds tensors of sizes {found[:6]}, this optimizer needs "
                                  f"{expected[:6]} (moments, worker and server residuals): other parameters?")

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["onebit"] = {
            "step_count": self.step_count, "warmup_steps": self.warmup_steps,
            "world_size": self.collective.world_size, "local_ranks": list(self.collective.local_ranks),
            "exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone(),
            "worker_errors": [e.clone() for e in self.worker_errors],
            "server_errors": [e.clone() for e in self.server_errors],
        }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        onebit = state_dict.get("onebit")
        if onebit is None:
            raise OneBitAdamError("not a OneBitAdam state dict (no 'onebit' entry)")
        if onebit["world_size"] != self.collective.world_size or \
                list(onebit["local_ranks"]) != list(self.collective.local_ranks):
            raise OneBitAdamError(f"state saved by ranks {onebit['local_ranks']} of {onebit['world_size']} cannot "
                                  f"load into ranks {list(self.collective.local_ranks)} of "
                                  f"{self.collective.world_size}: residuals belong to their rank")
        self._check_saved_tensors(onebit)
        step_count = parse_count(onebit["step_count"], "OneBitAdam state: step_count", error=OneBitAdamError)
        warmup_steps = parse_count(onebit["warmup_steps"], "OneBitAdam state: warmup_steps", 1, OneBitAdamError)
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "onebit"})
        self.step_count, self.warmup_steps = step_count, warmup_steps
        self.exp_avg = onebit["exp_avg"].to(self.device, copy=True)
        self.exp_avg_sq = onebit["exp_avg_sq"].to(self.device, copy=True)
        self.reducer.load_state_dict(onebit)


def _saved_sizes(onebit: dict[str, Any]) -> list[int | None]:
    """Sizes of the saved tensors in a fixed order (None where one is not a float tensor)."""
    tensors = [onebit.get("exp_avg"), onebit.get("exp_avg_sq"), *list(onebit.get("worker_errors", [])),
               *list(onebit.get("server_errors", []))]
    return [t.numel() if isinstance(t, torch.Tensor) and t.is_floating_point() else None for t in tensors]


def finite_number(value: Any, name: str, *, low: float, high: float = math.inf, low_open: bool = False,
                  high_open: bool = False) -> float:
    """`value` as a float if it is a finite real number in the range, else OneBitAdamError naming it."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(float(value))
    ok = ok and (low < value if low_open else low <= value) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise OneBitAdamError(f"OneBitAdam: {name} must be a finite number in {interval}, got {str(value)[:60]}")
    return float(value)


def _check_group_options(group: dict[str, Any], where: str) -> None:
    """lr >= 0, eps > 0, weight_decay >= 0 (finite), betas two numbers in [0, 1)."""
    finite_number(group["lr"], where + "lr", low=0.0)
    finite_number(group["eps"], where + "eps", low=0.0, low_open=True)
    finite_number(group["weight_decay"], where + "weight_decay", low=0.0)
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise OneBitAdamError(f"OneBitAdam: {where}betas must be two numbers (beta1, beta2), got {str(betas)[:60]}")
    for index, beta in enumerate(betas):
        finite_number(beta, f"{where}betas[{index}]", low=0.0, high=1.0, high_open=True)


def _checked_collective(collective: Any) -> Collective:
    if collective is None:
        return SimulatedCollective(1)
    missing = [name for name in ("world_size", "local_ranks", "ledger", "all_reduce_mean", "all_to_all", "all_gather")
               if not hasattr(collective, name)]
    if missing:
        raise OneBitAdamError(f"OneBitAdam: collective must be a Collective (SimulatedCollective, TorchCollective), "
                              f"got {type(collective).__name__} lacking {missing}")
    return collective


def _clipped(grad: torch.Tensor, max_norm: float | None) -> torch.Tensor:
    """A float32 copy of one worker's local gradient, clipped to `max_norm` (None: as it is)."""
    if max_norm is None:
        return grad.float()
    copy = grad.float().clone()
    clip_grad_norm_([copy], max_norm)
    return copy
