"""Tied weights across pipeline stages (GPT-2's token embedding = its LM head).

Every rank builds the whole model from the same seed and keeps its stage, so the copies of a tied
weight on the first and the last stage start equal. They stay equal if, after each backward, both
copies' gradients are replaced by their sum (the gradient of the one shared parameter) before the
optimizer step: `sum_tied_gradients` does that for stage modules in one process,
`all_reduce_tied_gradients` over a process group of the ranks holding the copies (one group per replica).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from geotrain.models.layers import LayerModelError, TiedWeight, check_boundaries


@dataclass(frozen=True)
class StageTie:
    """One tied weight as seen by the stages holding it: stage index -> parameter name in that stage's module."""

    names: tuple[tuple[int, str], ...]

    @property
    def stages(self) -> tuple[int, ...]:
        return tuple(stage for stage, _ in self.names)

    def name_in(self, stage: int) -> str:
        for held_by, name in self.names:
            if held_by == stage:
                return name
        raise LayerModelError(f"stage {stage} does not hold this tied weight (held by stages {self.stages})")


def stage_ties(ties: Sequence[TiedWeight], boundaries: Sequence[int], n_layers: int) -> tuple[StageTie, ...]:
    """The tied weights that cross a stage cut, named as in LayerModel.stage_module(boundaries, s).

    A weight tied only inside one stage is one parameter of that stage's module and needs nothing.
    """
    cuts = check_boundaries(boundaries, n_layers)
    crossing = []
    for tie in ties:
        per_stage: dict[int, str] = {}
        for layer, name in tie.places:
            stage = max(s for s in range(len(cuts) - 1) if cuts[s] <= layer)
            per_stage.setdefault(stage, f"{layer - cuts[stage]}.{name}")
        if len(per_stage) > 1:
            crossing.append(StageTie(tuple(sorted(per_stage.items()))))
    return tuple(crossing)


def _grad_of(module: nn.Module, name: str) -> torch.Tensor:
    param = module.get_parameter(name)
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    return param.grad


def sum_tied_gradients(modules: Mapping[int, nn.Module], ties: Sequence[StageTie]) -> None:
    """Replace the gradient of every copy of each tied weight by the sum over the copies (in place).

    `modules` maps stage index -> that stage's module (separate copies, as on separate ranks);
    every stage holding a tie must be present.
    """
    for tie in ties:
        missing = [stage for stage in tie.stages if stage not in modules]
        if missing:
            raise LayerModelError(f"tied weight held by stages {tie.stages}: no module given for stage(s) {missing}")
        grads = [_grad_of(modules[stage], tie.name_in(stage)) for stage in tie.stages]
        total = torch.stack(grads).sum(dim=0)
        for grad in grads:
            grad.copy_(total)


def all_reduce_tied_gradients(module: nn.Module, stage: int, ties: Sequence[StageTie], group: object) -> None:
    """sum_tied_gradients across ranks: all-reduce (sum) this stage's copies over `group`.

    `group` is a torch.distributed process group of exactly the ranks holding the copies for this
    replica (e.g. first and last stage of replica r); call it on each of them after backward. Sharded copies
    (FSDP2 / DTensor, sharded alike on every stage): `group` holds the same shard's ranks, and each all-reduces
    its local shard.
    """
    import torch.distributed as dist

    from geotrain.optim.shards import local_shard

    for tie in ties:
        if stage in tie.stages:
            dist.all_reduce(local_shard(_grad_of(module, tie.name_in(stage))), op=dist.ReduceOp.SUM, group=group)
