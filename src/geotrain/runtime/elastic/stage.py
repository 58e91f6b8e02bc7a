"""The part of a replica group's model one elastic process holds: the whole model (pipeline S = 1), or
stage s of S (S > 1: one process per stage), with the runtime's pipeline (runtime/pipeline.py) between
the group's stage processes; with a sharded plan (K > 1 devices per slot) shard k of K of it (FSDP2).

    position = group_position(config, rank)           # rank s x K + k of the group's S x K processes
    model = GroupStageModel(config, position, vocab_size, seq_len, timer)   # S x K > 1: after pipeline_group()
    loss = model.train_step(x, y)        # forward + backward; the mean loss on the last stage, else None
    val = model.validation_loss(val_tokens, windows, batch)              # nats on the last stage, else None

S > 1: the S stage processes of a group form a group of their own (`pipeline_group`: the process's default
group, over the group's own TCPStore, made when the group's processes start, so a restarted group makes a new one;
gloo on CPU); the activations and their gradients travel there by the pipeline
schedule (GPipe; the looped ones are refused by rules.py), and a weight tied across stages sums its
gradient there. The DP exchange is not on this group: each stage process has its own torchft Manager.
Every process builds the whole model from the run's seed and keeps its stage's layers (runtime/stages.py),
so the stages of every group start identical, and a restarted group's stages are those of its peers.

K > 1 (sharded replicas, runtime/sharded.py): a group is S x K processes, group rank s x K + k; stage s's K
processes hold FSDP2 shards of the stage over a group of their own (parameters all-gathered and
gradients reduce-scattered inside the site), each computes on its 1/K of the group's batch, and shard k's
activations go to shard k of the next stage. The DP exchange is per position (stage, shard), between the
same position of every group, over that position's torchft Manager (group.py).

Backends (`own_group_backend`, comm/groups.group_backend's one rule over the sites of the group's plan devices): on
CPU every group of a group's own is gloo (or the link emulator's); on CUDA (each process on a GPU of its own:
group.py group_torch_device) the default group is the per-device string (its host scalars on gloo, a K = 1
pipeline's activations on NCCL) and the FSDP2, pipeline and tied-weight groups inside one site are NCCL alone. The
CUDA path has not run on a GPU (benchmarks/cuda/check.sh has the row).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from geotrain.comm.groups import collective_timeout, group_backend, new_group
from geotrain.models import MODEL_PRESETS, all_reduce_tied_gradients, lm_loss, stage_ties, validation_starts
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.pipeline import Pipeline, pipeline_forward
from geotrain.runtime.sharded import fully_shard_stage
from geotrain.runtime.stages import build_layer_model, stage_boundaries, stage_modules, stage_shapes
from geotrain.sync.base import ComputeTimer

PIPELINE_PREFIX = "geotrain-pipeline/"
"""Prefix of the pipeline group's rendezvous keys in the replica group's own TCPStore."""


@dataclass(frozen=True)
class GroupPosition:
    """Where one process sits in its replica group: pipeline stage `stage`, shard `shard` of `k` (module doc)."""

    stage: int
    shard: int = 0
    k: int = 1

    @property
    def rank(self) -> int:
        """Its group rank (torchft's, and the group's own gloo group's): stage x K + shard."""
        return self.stage * self.k + self.shard


def group_size(config: RuntimeConfig) -> int:
    """The processes of one replica group: S stages x K shards."""
    return config.stages * config.layout.k


def group_position(config: RuntimeConfig, rank: int) -> GroupPosition:
    """The position of group rank `rank` (0 .. S x K - 1)."""
    stage, shard = divmod(rank, config.layout.k)
    return GroupPosition(stage, shard, config.layout.k)


def own_group_backend(config: RuntimeConfig, group: int, ranks: Iterable[int], dimension: str,
                      device_type: str) -> str | None:
    """The backend of replica group `group`'s own process group of group ranks `ranks` spanning `dimension`
    ("world": the group's default group; "shard", "pipeline": comm/groups.GROUP_DIMENSIONS) on `device_type`:
    comm/groups.group_backend over the sites of those ranks' plan devices."""
    positions = [group_position(config, rank) for rank in ranks]
    sites = {config.cluster.site_of(int(config.layout.devices[p.stage, group, p.shard])) for p in positions}
    return group_backend(device_type, dimension, len(sites))


def pipeline_group(store: Any, rank: int, size: int, timeout_s: float, backend: str | None = "gloo") -> None:
    """Make the group of a replica group's `size` processes (this one is group rank `rank`) this process's
    default group, over `store` (the group's own TCPStore, fresh for each start of the group), on `backend`
    (`own_group_backend`'s "world": gloo on CPU)."""
    import torch.distributed as dist

    dist.init_process_group(backend, store=dist.PrefixStore(PIPELINE_PREFIX, store), rank=rank, world_size=size,
                            timeout=collective_timeout(timeout_s))


class GroupStageModel:
    """Stage `position.stage` of the run's model (the whole model when S = 1; K > 1: FSDP2 shard `position.shard`
    of it) and, S > 1, its pipeline over the process's default group (`pipeline_group` first). `timer`
    accumulates the compute seconds. `group`: the replica group (its plan devices' sites pick its own groups'
    backends, `own_group_backend`); `device`: where this process computes (the stage is moved there before
    FSDP2 shards it)."""

    def __init__(self, config: RuntimeConfig, position: GroupPosition, vocab_size: int, seq_len: int,
                 timer: ComputeTimer, group: int = 0, device: torch.device = torch.device("cpu")) -> None:
        stage = position.stage
        self.position, self.stage, self.stages, self.timer = position, stage, config.stages, timer
        self.config, self.group, self.device = config, group, device
        self.timeout_s = config.reliability.comm_timeout_s
        # every process creates every group of the group's S x K ranks, in one order (torch's new_group rule)
        k, stages = position.k, range(config.stages)
        shard_groups = [self._new_group([GroupPosition(s, j, k).rank for j in range(k)], "shard")
                        for s in stages] if k > 1 else None
        pp_groups = [self._new_group([GroupPosition(s, j, k).rank for s in stages], "pipeline")
                     for j in range(k)] if k > 1 and config.stages > 1 else None
        self.pp_ranks = [GroupPosition(s, position.shard, k).rank for s in stages]  # this shard's pipeline
        model = build_layer_model(config.model.model_name, MODEL_PRESETS, config.run.seed, vocab_size, seq_len)
        if self.stages == 1:
            self.boundaries: tuple[int, ...] = (0, model.n_layers)
            self.modules = stage_modules(model, self.boundaries, [0])
            self.ties: tuple[Any, ...] = ()
        else:
            # "time" is refused by rules.py: a measured split could differ between a group and its restart
            boundaries = stage_boundaries(model, self.stages, config.schedule.split, seq_len,
                                          weights=config.split_weights(),
                                          plan_boundaries=config.schedule.split_boundaries)
            self.boundaries = tuple(boundaries)
            wire = config.comm.wire_dtypes()
            self.modules = stage_modules(model, boundaries, [stage], wire, seq_len)
            self.shapes = stage_shapes(model, boundaries, config.microbatch_size // k, seq_len, wire)  # a shard's rows
            self.ties = self._tie_groups(stage_ties(model.tied_weights, boundaries, model.n_layers))
        # on this process's device before its pipeline stage and FSDP2 take it (in place: the parameters stay the
        # objects the syncs will hold)
        self.modules[stage].to(device)
        self.pipeline: Pipeline | None = None if self.stages == 1 else Pipeline(
            config.schedule.schedule, self.modules, self.shapes, config.schedule.microbatches, lm_loss,
            None if pp_groups is None else pp_groups[position.shard], device, timer)
        self.shard_group = None if shard_groups is None else shard_groups[stage]
        if self.shard_group is not None:
            fully_shard_stage([self.modules[stage]], self.shard_group, device)
        self.module = self.modules[stage]
        self.params = list(self.module.parameters())  # K > 1: DTensors (FSDP2 shards), after fully_shard

    def _new_group(self, ranks: list[int], dimension: str) -> Any:
        """A group of this replica group's `ranks` with the run's timeout and its `dimension`'s backend."""
        return new_group(ranks, self.timeout_s,
                         own_group_backend(self.config, self.group, ranks, dimension, self.device.type))

    @property
    def has_first(self) -> bool:
        return self.stage == 0

    @property
    def has_last(self) -> bool:
        return self.stage == self.stages - 1

    def _tie_groups(self, ties: Any) -> list[tuple[Any, Any]]:
        """(tie, group of the stages holding it, this shard's) per weight tied across stages; every
        process creates every group, in the same order (torch's new_group rule)."""
        k = self.position.k
        groups = [[self._new_group([GroupPosition(s, j, k).rank for s in sorted(tie.stages)], "pipeline")
                   for j in range(k)] for tie in ties]
        return [(tie, shards[self.position.shard]) for tie, shards in zip(ties, groups, strict=True)]

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        """Forward and backward of this group's batch (gradients in the stage's parameters, as for the
        mean loss); the mean loss (nats) where the last stage is, else None."""
        if self.pipeline is None:
            with self.timer:
                loss = lm_loss(self.module(inputs), targets)
                loss.backward()
            return self._slot_mean(float(loss.detach()))
        loss_value = self.pipeline.step(inputs if self.has_first else None, targets if self.has_last else None)
        for tie, group in self.ties:
            if self.stage in tie.stages:
                all_reduce_tied_gradients(self.module.layers, self.stage, [tie], group)
        return None if loss_value is None else self._slot_mean(loss_value)

    def _slot_mean(self, loss: float) -> float:
        """K > 1: the mean of the stage's K shards' losses (each on its 1/K of the batch: the group's loss, nats);
        K = 1: `loss`."""
        if self.shard_group is None:
            return loss
        import torch.distributed as dist

        total = torch.tensor([loss], dtype=torch.float64, device=self.device)  # CUDA: the shard group is NCCL
        dist.all_reduce(total, group=self.shard_group)
        return float(total) / self.position.k

    def validation_loss(self, val: np.ndarray, seq_len: int, windows: int | None, batch: int) -> float | None:
        """Mean validation loss (nats) over at most `windows` held-out windows, on the last stage (else None);
        S > 1: every stage process of the group takes part (activations along the pipeline, no gradients)."""
        starts = validation_starts(len(val), seq_len, windows)
        total, count = 0.0, 0
        self.module.eval()
        with torch.no_grad():
            for i in range(0, len(starts), batch):
                offsets = starts[i:i + batch, None] + np.arange(seq_len + 1)
                tokens = torch.from_numpy(np.asarray(val)[offsets].astype(np.int64)).to(self.params[0].device)
                if self.pipeline is None:
                    logits: torch.Tensor | None = self.module(tokens[:, :-1])
                else:
                    logits = pipeline_forward(self.modules, self.shapes, self.stage, self.pp_ranks,
                                              tokens[:, :-1] if self.has_first else None, len(tokens))
                if logits is not None:
                    total += float(lm_loss(logits, tokens[:, 1:])) * tokens[:, 1:].numel()
                    count += tokens[:, 1:].numel()
        self.module.train()
        return total / count if count else None
