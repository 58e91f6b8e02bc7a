"""Moment sync for asynchronous DiLoCo (`--outer-sync async|async-hierarchical --sync-moments`): the global model's
server also holds global AdamW moments, merged from the replicas' pushes as their outer gradients are.

The synchronous sync (geotrain.sync.moments) gives every replica the mean of the R replicas' moments at each outer
sync. Asynchronously there is no moment at which all R have theirs, so the server holds an estimate beside the model.
Its flat buffer (and every push, reply and checkpoint of it) is three parts of the position's n parameters:

    [ parameters (n) | first moments m (n) | second moments v (n) ]    (flat fp32, this position's local shards)

A replica builds its push as it builds the outer gradient: (what it last received - what it holds now), over all
three parts, i.e. (m_base - m, v_base - v) beside (theta_base - theta). The server's outer optimizer
(geotrain.optim.delayed_nesterov, behind the --async-merge rule) steps the parameter part; `MomentMerge` moves the
moment parts by the same arrival's staleness weight w = (1 + s) ** -P over the server's N clients, with no outer lr
and no momentum (the moments are averaged, not stepped):

    m -= (w / N) (m_base - m_replica)        v -= (w / N) (v_base - v_replica),  then v >= 0

so N fresh arrivals from one base leave the server holding exactly the mean of their moments (the synchronous
sync's landing), and in between it is a running average of the replicas' latest moments, each arrival pulling it
1/N of the way. With regions (async-hierarchical) the region server merges its replicas' moments so, and its delta to
the global server carries the moment parts too, merged there over the regions likewise (the global server's outer
step is lr 1, no momentum: the same rule). The reply carries the global moments; the replica loads them into its
AdamW (exp_avg, exp_avg_sq) once the global model holds at least R replica outer gradients (`loads_moments`:
before that the server's moments still average zeros for the replicas not heard from). AdamW's step count stays
each replica's own (its bias correction). The moments travel raw, as the synchronous sync sends them, though
replicas here take different numbers of steps: a variant that sent them bias-corrected (m / (1 - beta1 ** t),
v / (1 - beta2 ** t) at the replica's own t, loaded times its own correction) ended bench hetero 0.025 to 0.026
nats worse than this one on both of two seeds (docs/history/async-staleness.md, "Moment sync").

Cost: a push and a reply carry 3n fp32 values instead of n (asynchronous updates send fp32, no codec; the bytes on
the links and the emulated link time count all three parts). Checkpoints and --resume: the server's buffer, each
client's copy of it and each replica's AdamW are saved already, so the moments travel with them. Elastic asynchronous
groups (runtime/elastic/async_group.py: a server re-elected from a replica's copy of the model) are not built with
moments (runtime/elastic/rules.py refuses the three together).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from geotrain.optim.shards import local_shard
from geotrain.sync.base import SyncError

MOMENT_PARTS = 2
"""The moment parts after the parameters in a server's flat buffer: the first moment, the second."""


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
    """[m | v] of `params` (module doc), flat fp32, in the order of `params`."""
    pairs = [_moments_of(optimizer, p) for p in params]
    return torch.cat([t.detach().reshape(-1).to(torch.float32) for part in (0, 1) for t in
                      (pair[part] for pair in pairs)])


def load_moments(optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Write [m | v] (`flat`, as flat_moments lays it out) into `params`' AdamW moments; v kept >= 0."""
    pairs = [_moments_of(optimizer, p) for p in params]
    n = sum(m.numel() for m, _ in pairs)
    if flat.numel() != MOMENT_PARTS * n:
        raise SyncError(f"asynchronous moment sync: {flat.numel()} moment values for {n} parameters' two moments")
    offset = 0
    with torch.no_grad():
        for part in (0, 1):
            for pair in pairs:
                t = pair[part]
                value = flat[offset:offset + t.numel()].view_as(t)
                t.copy_((value.clamp_min(0) if part else value).to(t.device, t.dtype))
                offset += t.numel()


def loads_moments(updates: int, replicas: int) -> bool:
    """Whether a replica loads the global moments of a reply whose model holds `updates` replica outer gradients, in
    a run of `replicas` (module doc: not before the server has merged R of them)."""
    return updates >= replicas


class MomentMerge:
    """A server's outer step over [parameters | m | v] (module doc): `optimizer` steps the first `numel` values (the
    parameters); the moment parts move by the weight it gave the arrival / `period` (N, the server's clients)."""

    def __init__(self, optimizer: OuterStep, numel: int, period: int) -> None:
        if numel < 1 or period < 1:
            raise SyncError(f"MomentMerge: numel {numel} and period {period} must be >= 1")
        self.optimizer = optimizer
        self.numel = numel
        self.period = period

    def step(self, theta: torch.Tensor, gradient: torch.Tensor, staleness: int = 0) -> float:
        """Apply one arrival's `gradient` (over all three parts) to `theta` in place; the staleness weight it got."""
        n = self.numel
        if theta.numel() != (1 + MOMENT_PARTS) * n or gradient.shape != theta.shape:
            raise SyncError(f"MomentMerge: model of {theta.numel()} and gradient of {gradient.numel()} values, "
                            f"expected {(1 + MOMENT_PARTS) * n} each ({n} parameters and their two moments)")
        weight = self.optimizer.step(theta[:n], gradient[:n], staleness)  # the parameters' staleness weight
        theta[n:].sub_(gradient[n:].to(torch.float32), alpha=weight / self.period)
        theta[2 * n:].clamp_min_(0)
        return weight

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
