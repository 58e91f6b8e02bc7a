"""The DP exchange of an elastic run: the mean over the live replica groups of the current torchft
quorum (geotrain.runtime.elastic), through the Manager's reconfigurable process group (with pipeline
S > 1, one Manager per stage process: stage s's exchange goes between the groups' stage-s processes).

One flat float32 all-reduce (SUM) per exchange carries every gradient and, last, this group's weight:
1 for a contributing group, 0 for one that recovered its state from a peer in this very quorum with
--sync-every (its outer gradient would repeat the peer's). Each member divides by the summed weight, so
the mean is over the contributing groups, whatever their number. After the all-reduce the Manager's
`should_commit` says whether every member of the quorum got it; if not (a peer died mid-way), the
exchange starts a new quorum (without the lost peer) and tries again with the same local gradient,
at most `retries` times. A retry's quorum may hand this group a newer state (it fell behind a peer
that committed): the step is then superseded (`StepSuperseded`) and the worker goes on from the
recovered step.

    exchange = ManagerExchange(params, manager, healed=lambda: state.healed)
    sync = make_elastic_sync(options, params, exchange)      # PerStepSync or OuterSync around it
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.optim.outer import OuterStep
from geotrain.sync.base import GradientSync, StepTimer
from geotrain.sync.factory import BETAS, WEIGHT_DECAY
from geotrain.sync.options import SyncOptions
from geotrain.sync.outer import OuterSync
from geotrain.sync.per_step import PerStepSync

EXCHANGE_RETRIES = 5
"""New quorums an exchange tries after a failed one before it gives up (each waits for the lost peer's
heartbeat timeout at most): enough for several groups failing one after another."""


class StepSuperseded(Exception):  # noqa: N818 - a control-flow signal, not an error
    """A retry's quorum gave this group a peer's newer state: drop this step's work, go on from the state's step."""


class QuorumLost(RuntimeError):
    """The exchange failed `retries` quorums in a row (transient: the group's launcher may restart it)."""


class ManagerExchange:
    """DPExchange over a torchft Manager's quorum (see the module doc). `manager`: a torchft Manager whose
    quorum for this step was started; `healed()`: True when this group loaded a peer's state in the
    quorum just started; `weight_on_heal`: this group's weight in such a quorum (0 with --sync-every);
    `start_quorum`: how a retry starts a new quorum (default: the manager's); `abort`: aborts the
    process group after a failed exchange (its next quorum configures a new one). `comm_s`: wall seconds
    spent in the all-reduces and commits so far (retries and their quorums included)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], manager: Any, healed: Callable[[], bool],
                 weight_on_heal: float = 1.0, retries: int = EXCHANGE_RETRIES,
                 start_quorum: Callable[[], None] | None = None, abort: Callable[[], None] | None = None) -> None:
        self.params = list(params)
        self.abort = abort
        self.manager = manager
        self.start_quorum = manager.start_quorum if start_quorum is None else start_quorum
        self.healed = healed
        self.weight_on_heal = weight_on_heal
        self.retries = retries
        self.failed_quorums = 0
        self.contributors = 0.0
        self.comm_s = 0.0

    def exchange(self, step: int, timer: StepTimer) -> int:
        """Average the gradients over the quorum's contributing groups, in place; bytes handed to the all-reduce."""
        from torch.distributed import ReduceOp

        with timer:
            grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
            weight = self.weight_on_heal if self.healed() else 1.0
            local = torch.cat([g.detach().reshape(-1).float() * weight for g in grads] +
                              [torch.tensor([weight], dtype=torch.float32)])
        started = time.perf_counter()
        for attempt in range(self.retries + 1):
            if attempt:
                self.start_quorum()
                if self.healed():
                    raise StepSuperseded(f"step {step}: recovered a newer state from a peer")
            buffer = local.clone()
            self.manager.allreduce(buffer, reduce_op=ReduceOp.SUM).wait()
            if self.manager.should_commit():
                break
            self.failed_quorums += 1
            if self.abort is not None:
                self.abort()  # close our links now: members blocked on us in the ring fail at once, not at their timeout
        else:
            raise QuorumLost(f"elastic exchange at step {step}: {self.retries + 1} quorums in a row failed to commit")
        self.comm_s += time.perf_counter() - started
        self.contributors = float(buffer[-1])
        if self.contributors <= 0:
            raise QuorumLost(f"elastic exchange at step {step}: no contributing replica group in the quorum")
        with timer:
            offset = 0
            for p, g in zip(self.params, grads, strict=True):
                mean = (buffer[offset:offset + g.numel()] / self.contributors).view_as(g).to(g.dtype)
                p.grad = mean
                offset += g.numel()
        return local.numel() * local.element_size()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def make_elastic_sync(options: SyncOptions, params: Sequence[torch.nn.Parameter], exchange: ManagerExchange,
                      sum_squares: Callable[[float], float] | None = None) -> GradientSync:
    """PerStepSync (no sync_every) or blocking OuterSync (sync_every H) around `exchange`, with AdamW as
    geotrain.sync.make_gradient_sync builds it. Clipping: `sum_squares` turns this process's sum of squared
    (averaged) gradients into the whole model's (a pipeline stage: summed over the group's stages); None:
    local (the process holds the whole model)."""
    params = list(params)
    adamw = torch.optim.AdamW(params, lr=options.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
    if options.outer.sync_every is None:
        return PerStepSync(params, exchange, adamw, options.clip_grad_norm, sum_squares)
    outer = OuterStep(params, options.outer.sync_every, options.outer.outer_lr, options.outer.outer_momentum)
    return OuterSync(params, adamw, outer, exchange, options.total_steps)
