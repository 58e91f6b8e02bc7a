"""The end of a worker's iteration: the stage's data-parallel averaging, global gradient clipping and
the optimizer step, for `--optimizer adamw` (the `--dp-codec` reducer, then AdamW) and `onebit-adam`
(OneBitAdam averages over the stage's DP group itself: fp32 in its warm-up, 1-bit momenta after).

Global clipping (`--clip-grad-norm X`): the norm of the whole model's averaged gradient, all stages,
is sqrt(sum over stages of |g_s|^2). Every rank adds the squares of its stage's averaged gradient and
one float64 scalar all-reduce over the world sums them; each stage's R replicas hold the same
averaged gradient, so the sum counts every stage R times and is divided by R. Every rank then scales
its gradient by the same factor (geotrain.comm.clip_grad_norm_). With onebit-adam the averaged
gradient exists only during the warm-up, which is where OneBitAdam clips (after the freeze its update
is linear in the gradient: see geotrain.optim.onebit_adam). The scalar all-reduce is not timed as DP
communication (one latency per step).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from geotrain.comm.clip import clip_grad_norm_
from geotrain.comm.hierarchical import HierarchicalGroups
from geotrain.optim import OneBitAdam
from geotrain.optim.outer import OuterStep
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.exchange import StageExchange, timed_collective
from geotrain.runtime.hierarchical_exchange import HierarchicalGradientExchange
from geotrain.runtime.transport import Transport

BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1


def world_sum_over_replicas(replicas: int) -> Callable[[float], float]:
    """sum_squares for clip_grad_norm_: this rank's value summed over the world, divided by `replicas`."""
    def sum_squares(local: float) -> float:
        total = torch.tensor([local], dtype=torch.float64)
        dist.all_reduce(total)
        return float(total.item()) / replicas

    return sum_squares


class DataParallelStep:
    """Averages one stage's gradients over its DP group, clips them globally and steps the optimizer."""

    def __init__(self, config: RuntimeConfig, stage: torch.nn.Module, transport: Transport, group: Any,
                 group_devices: list[int], hierarchy: HierarchicalGroups | None = None, rank: int = 0) -> None:
        """`hierarchy`: the DP group's region hierarchy for --dp-hierarchical (None: the flat reducer);
        `rank`: this process's global rank (the hierarchy's shard ownership)."""
        self.params = list(stage.parameters())
        self.clip = config.optim.clip_grad_norm
        self.sum_squares = world_sum_over_replicas(config.replicas)
        self.exchange: StageExchange | HierarchicalGradientExchange | None = None
        self.comm_wall_s = 0.0
        self.outer: OuterStep | None = None
        if config.optim.optimizer == "onebit-adam":
            self.collective = timed_collective(transport, group, group_devices, self._add_wall_s)
            self.optimizer: torch.optim.Optimizer = OneBitAdam(
                stage.named_parameters(), lr=config.optim.lr, betas=BETAS, weight_decay=WEIGHT_DECAY,
                warmup_steps=config.optim.onebit_warmup_steps, collective=self.collective,
                max_grad_norm=self.clip, norm_sum_squares=self.sum_squares)
            return
        if hierarchy is not None:
            self.exchange = HierarchicalGradientExchange(self.params, config.comm.dp_codec.build(),
                                                         config.comm.error_feedback,
                                                         transport, hierarchy, rank)
        else:
            self.exchange = StageExchange(list(stage.named_parameters()), str(config.comm.dp_codec),
                                          config.comm.error_feedback,
                                          transport, group, group_devices)
        self.optimizer = torch.optim.AdamW(self.params, lr=config.optim.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
        self.total_steps = config.run.steps
        optim = config.optim
        self.outer = (None if optim.sync_every is None else
                      OuterStep(self.params, optim.sync_every, optim.outer_lr, optim.outer_momentum))
        # local SGD with --dp-hierarchical: each region is one worker (its members average gradients
        # every step inside the region, at full precision); the regions exchange deltas every H steps
        self.region_exchange: StageExchange | None = None
        if self.outer is not None and hierarchy is not None:
            region = hierarchy.regions.region_of(rank)
            if hierarchy.intra[region] is not None:
                members = hierarchy.regions.members[region]
                self.region_exchange = StageExchange(list(stage.named_parameters()), "none", False, transport,
                                                     hierarchy.intra[region],
                                                     [transport.layout.slot(m).device for m in members])

    def _add_wall_s(self, seconds: float) -> None:
        self.comm_wall_s += seconds

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self, step: int, timer: Any) -> tuple[int, float | None]:
        """Average, clip, step. Returns (bytes this rank handed to its DP group's collectives, the global
        gradient norm before clipping, or None when it was not measured)."""
        if self.outer is not None:
            return self._local_step(step, timer), None
        if self.exchange is not None:
            dp_bytes = self.exchange.exchange(step, timer)
            norm = None
            if self.clip is not None:
                with timer:
                    norm = clip_grad_norm_([p.grad for p in self.params if p.grad is not None], self.clip,
                                           self.sum_squares)
            with timer:
                self.optimizer.step()
            return dp_bytes, norm
        assert isinstance(self.optimizer, OneBitAdam)
        before, comm_before = self.collective.ledger.handed_bytes, self.comm_wall_s
        warmup = not self.optimizer.frozen
        started = time.perf_counter()
        self.optimizer.step()
        timer.seconds += time.perf_counter() - started - (self.comm_wall_s - comm_before)
        norm = self.optimizer.last_grad_norm if warmup and self.clip is not None else None
        return self.collective.ledger.handed_bytes - before, norm

    def _local_step(self, step: int, timer: Any) -> int:
        """Local SGD (--sync-every): AdamW on this replica's own gradients (with --dp-hierarchical, on its
        region's mean gradient: a region is one worker); when an outer period ends,
        the stage's exchange averages the outer gradients (in place of the gradients) and the outer
        optimizer steps the anchor. Returns the bytes handed to the DP group's collectives."""
        assert self.outer is not None and self.exchange is not None
        region_bytes = 0 if self.region_exchange is None else self.region_exchange.exchange(step, timer)
        with timer:
            self.optimizer.step()
        if not self.outer.due(step, self.total_steps):
            return region_bytes
        with timer:
            for p, outer_gradient in zip(self.params, self.outer.outer_gradients(), strict=True):
                p.grad = outer_gradient.to(p.dtype)
        dp_bytes = self.exchange.exchange(step, timer)
        with timer:
            self.outer.apply([p.grad for p in self.params])
        return region_bytes + dp_bytes

    def fingerprint(self) -> float:
        """A float64 sum of the weights the stage's replicas agree on (its parameters; with --sync-every,
        the anchor, since the parameters differ between synchronisations)."""
        if self.outer is not None:
            return self.outer.anchor_sum()
        return float(sum(p.detach().double().sum() for p in self.params))

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(),
                "exchange": None if self.exchange is None else self.exchange.state_dict(),
                **({"outer": self.outer.state_dict()} if self.outer is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.outer is not None:
            if "outer" not in state:
                raise ValueError("checkpoint was written without --sync-every")
            self.outer.load_state_dict(state["outer"])
        if self.exchange is not None:
            self.exchange.load_state_dict(state["exchange"])
