"""Moment sync for asynchronous DiLoCo (`--outer-sync async|async-hierarchical --sync-moments`): the global model's
server also holds a global AdamW second moment, merged from the replicas' pushes as their outer gradients are.

The synchronous sync (geotrain.sync.moments) gives every replica the mean of the R replicas' two moments at each
outer sync. Asynchronously there is no moment at which all R have theirs, so the server holds an estimate beside the
model. It holds the second moment v (exp_avg_sq) only: each replica keeps its own first moment m. Merging m too
(built and measured first, docs/history/async-staleness.md "Moment sync") ended bench hetero 0.013 to 0.023 nats
worse than no moment sync at 60 steps and 0.12 worse at 300: a slow replica's m points along gradients of a model
several versions old, which the fast replicas then step along. v is a per-coordinate scale, which a few versions'
age does not turn. Its flat buffer (and every push, reply and checkpoint of it) is two parts of the position's n
parameters:

    [ parameters (n) | second moments v (n) ]    (flat fp32, this position's local shards)

A push carries the parameter part as the outer gradient (what the replica last received - what it holds now,
theta_base - theta) and the moment part as the replica's v itself (`push_of`). The server's outer optimizer
(geotrain.optim.delayed_nesterov, behind the --async-merge rule) steps the parameter part; `MomentMerge` moves the
server's v toward the arrival's by that arrival's staleness weight w = (1 + s) ** -P over the server's N clients,
with no outer lr and no momentum (the moments are averaged, not stepped):

    v <- v + (w / N) (v_replica - v)        (a convex step: v stays >= 0, between the two)

a running average of the replicas' latest v, each arrival pulling it at most 1/N of the way. A first build sent v as
a delta from the replica's base (v_base - v_replica), which made N fresh arrivals land on the exact mean; but stale
deltas add up: an arrival's delta is measured from a base the server has since moved away from, so under some arrival
orders the server's v was driven to 0 on some coordinates (clamped), and a replica that loaded it stepped AdamW by
m / eps there (a CI run's resumed 2-stage run diverged to 4.65 nats against 3.02). With regions (async-hierarchical)
the region server merges its replicas' v so, and its push to the global server carries the region's v likewise
(merged there over the regions by the same rule). The reply carries the global v; the replica loads it into its AdamW
(exp_avg_sq) once the global model holds at least R replica outer gradients (`loads_moments`: before that the server's
v is still mostly its zero start). AdamW's step count stays each replica's own (its bias correction), and v
travels raw, as the synchronous sync sends it: a variant that sent both moments bias-corrected at each replica's own
step count measured 0.025 nats worse than raw.

Cost: a push and a reply carry 2n fp32 values instead of n (asynchronous updates send fp32, no codec; the bytes on
the links and the emulated link time count both parts). Checkpoints and --resume: the server's buffer, each client's
copy of it and each replica's AdamW are saved already, so the moments travel with them. Elastic asynchronous groups
(runtime/elastic/async_group.py: a server re-elected from a replica's copy of the model): every reply carries the
global v, so every client's copy holds it and an elected server starts from [parameters | v] of its copy; the
checkpoints its host writes hold the same buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from geotrain.optim.shards import local_shard
from geotrain.sync.async_merge import outer_optimizer
from geotrain.sync.base import SyncError

MOMENT_PARTS = 1
"""The moment parts after the parameters in a server's flat buffer: the second moment (module doc: not the first)."""


class OuterStep(Protocol):
    """A server's outer optimizer (DelayedNesterov or async_merge.MergingOptimizer)."""

    def step(self, theta: torch.Tensor, gradient: torch.Tensor, staleness: int = 0) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _moments_of(optimizer: torch.optim.Optimizer, param: torch.nn.Parameter) -> tuple[torch.Tensor, torch.Tensor]:
    """`param`'s AdamW moments (its local shard's; views: writes reach the state)."""
    state = optimizer.state.get(param, {})
    if "exp_avg" not in state or "exp_avg_sq" not in state:
        raise SyncError(f"asynchronous moment sync: a parameter of shape {tuple(param.shape)} has no AdamW moments at "
                        f"its push (the inner optimizer has not stepped it: no gradient reached it); freeze parameters "
                        f"that train on no data")
    return local_shard(state["exp_avg"]), local_shard(state["exp_avg_sq"])


def flat_moments(optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """The second moments v of `params` (module doc), flat fp32, in the order of `params`."""
    return torch.cat([_moments_of(optimizer, p)[1].detach().reshape(-1).to(torch.float32) for p in params])


def load_moments(optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Write `flat` (as flat_moments lays it out) into `params`' AdamW second moments, kept >= 0; the first moments
    stay this replica's own."""
    seconds = [_moments_of(optimizer, p)[1] for p in params]
    n = sum(v.numel() for v in seconds)
    if flat.numel() != MOMENT_PARTS * n:
        raise SyncError(f"asynchronous moment sync: {flat.numel()} second-moment values for {n} parameters")
    offset = 0
    with torch.no_grad():
        for v in seconds:
            v.copy_(flat[offset:offset + v.numel()].view_as(v).clamp_min(0).to(v.device, v.dtype))
            offset += v.numel()


def push_of(anchor: torch.Tensor, held: torch.Tensor, numel: int) -> torch.Tensor:
    """What a push carries (module doc) from `anchor` (the model last received) and `held` (what the sender holds now),
    both laid out [parameters (numel) | v]: the parameters' outer gradient, then the sender's v itself."""
    return torch.cat([anchor[:numel] - held[:numel], held[numel:]])


def loads_moments(updates: int, replicas: int) -> bool:
    """Whether a replica loads the global moments of a reply whose model holds `updates` replica outer gradients, in
    a run of `replicas` (module doc: not before the server has merged R of them)."""
    return updates >= replicas


def server_optimizer(merge: str, period: int, lr: float, momentum: float, staleness_power: float,
                     moments_after: int | None) -> OuterStep:
    """A global or region server's outer optimizer (async_merge.outer_optimizer: the `merge` rule, `period` arrivals
    per momentum update, `lr`, `momentum`, `staleness_power`); with moment sync (`moments_after`: the parameters'
    count, their v after them) behind MomentMerge; None: the parameters only."""
    step = outer_optimizer(merge, period, lr, momentum, staleness_power)
    return step if moments_after is None else MomentMerge(step, moments_after, period)


class MomentMerge:
    """A server's outer step over [parameters | v] (module doc): `optimizer` steps the first `numel` values (the
    parameters); v moves toward the arrival's by the weight it gave the arrival / `period` (N, the server's clients)."""

    def __init__(self, optimizer: OuterStep, numel: int, period: int) -> None:
        if numel < 1 or period < 1:
            raise SyncError(f"MomentMerge: numel {numel} and period {period} must be >= 1")
        self.optimizer = optimizer
        self.numel = numel
        self.period = period

    def step(self, theta: torch.Tensor, gradient: torch.Tensor, staleness: int = 0) -> float:
        """Apply one arrival (`gradient`: push_of's layout) to `theta` in place; the staleness weight it got."""
        n = self.numel
        if theta.numel() != (1 + MOMENT_PARTS) * n or gradient.shape != theta.shape:
            raise SyncError(f"MomentMerge: model of {theta.numel()} and gradient of {gradient.numel()} values, "
                            f"expected {(1 + MOMENT_PARTS) * n} each ({n} parameters and their second moments)")
        weight = self.optimizer.step(theta[:n], gradient[:n], staleness)  # the parameters' staleness weight
        theta[n:].lerp_(gradient[n:].to(torch.float32), min(1.0, weight / self.period)).clamp_min_(0)
        return weight

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
