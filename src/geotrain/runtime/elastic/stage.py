"""The part of a replica group's model one elastic process holds: the whole model (pipeline S = 1), or
stage s of S (S > 1: one process per stage), with the runtime's pipeline (runtime/pipeline.py) between
the group's stage processes.

    model = GroupStageModel(config, stage, vocab_size, seq_len, timer)   # S > 1: after pipeline_group()
    loss = model.train_step(x, y)        # forward + backward; the mean loss on the last stage, else None
    val = model.validation_loss(val_tokens, windows, batch)              # nats on the last stage, else None

S > 1: the S stage processes of a group form a plain gloo group of their own (`pipeline_group`: the
process's default group, over the group's own TCPStore, made when the group's processes start, so a
restarted group makes a new one); the activations and their gradients travel there by the pipeline
schedule (GPipe; the looped ones are refused by rules.py), and a weight tied across stages sums its
gradient there. The DP exchange is not on this group: each stage process has its own torchft Manager.
Every process builds the whole model from the run's seed and keeps its stage's layers (runtime/stages.py),
so the stages of every group start identical, and a restarted group's stages are those of its peers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from geotrain.comm.groups import collective_timeout, new_group
from geotrain.models import MODEL_PRESETS, all_reduce_tied_gradients, lm_loss, stage_ties, validation_starts
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.pipeline import Pipeline, pipeline_forward
from geotrain.runtime.stages import build_layer_model, stage_boundaries, stage_modules, stage_shapes
from geotrain.sync.base import ComputeTimer

PIPELINE_PREFIX = "geotrain-pipeline/"
"""Prefix of the pipeline group's rendezvous keys in the replica group's own TCPStore."""


def pipeline_group(store: Any, stage: int, stages: int, timeout_s: float) -> None:
    """Make the gloo group of a replica group's `stages` stage processes (this one is rank `stage`) this
    process's default group, over `store` (the group's own TCPStore, fresh for each start of the group)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.PrefixStore(PIPELINE_PREFIX, store), rank=stage, world_size=stages,
                            timeout=collective_timeout(timeout_s))


class GroupStageModel:
    """Stage `stage` of the run's model (the whole model when S = 1) and, S > 1, its pipeline over the
    process's default group (`pipeline_group` first). `timer` accumulates the compute seconds."""

    def __init__(self, config: RuntimeConfig, stage: int, vocab_size: int, seq_len: int, timer: ComputeTimer) -> None:
        self.stage, self.stages, self.timer = stage, config.stages, timer
        self.timeout_s = config.reliability.comm_timeout_s
        model = build_layer_model(config.model.model_name, MODEL_PRESETS, config.run.seed, vocab_size, seq_len)
        if self.stages == 1:
            self.boundaries: tuple[int, ...] = (0, model.n_layers)
            self.modules = stage_modules(model, self.boundaries, [0])
            self.pipeline: Pipeline | None = None
            self.ties: tuple[Any, ...] = ()
        else:
            # "time" is refused by rules.py: a measured split could differ between a group and its restart
            boundaries = stage_boundaries(model, self.stages, config.schedule.split, seq_len,
                                          weights=config.split_weights(),
                                          plan_boundaries=config.schedule.split_boundaries)
            self.boundaries = tuple(boundaries)
            wire = config.comm.wire_dtypes()
            self.modules = stage_modules(model, boundaries, [stage], wire, seq_len)
            self.shapes = stage_shapes(model, boundaries, config.microbatch_size, seq_len, wire)
            self.pipeline = Pipeline(config.schedule.schedule, self.modules, self.shapes, config.schedule.microbatches,
                                     lm_loss, None, torch.device("cpu"), timer)
            self.ties = self._tie_groups(stage_ties(model.tied_weights, boundaries, model.n_layers))
        self.module = self.modules[stage]
        self.params = list(self.module.parameters())

    @property
    def has_first(self) -> bool:
        return self.stage == 0

    @property
    def has_last(self) -> bool:
        return self.stage == self.stages - 1

    def _tie_groups(self, ties: Any) -> list[tuple[Any, Any]]:
        """(tie, gloo group of the stages holding it) per weight tied across stages; every stage process
        creates every group, in the same order (torch's new_group rule)."""
        return [(tie, new_group(sorted(tie.stages), self.timeout_s)) for tie in ties]

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        """Forward and backward of this group's batch (gradients in the stage's parameters, as for the
        mean loss); the mean loss (nats) where the last stage is, else None."""
        if self.pipeline is None:
            with self.timer:
                loss = lm_loss(self.module(inputs), targets)
                loss.backward()
            return float(loss.detach())
        loss_value = self.pipeline.step(inputs if self.has_first else None, targets if self.has_last else None)
        for tie, group in self.ties:
            if self.stage in tie.stages:
                all_reduce_tied_gradients(self.module.layers, self.stage, [tie], group)
        return loss_value

    def validation_loss(self, val: np.ndarray, seq_len: int, windows: int | None, batch: int) -> float | None:
        """Mean validation loss (nats) over at most `windows` held-out windows, on the last stage (else None);
        S > 1: every stage process of the group takes part (activations along the pipeline, no gradients)."""
        starts = validation_starts(len(val), seq_len, windows)
        total, count = 0.0, 0
        self.module.eval()
        with torch.no_grad():
            for i in range(0, len(starts), batch):
                offsets = starts[i:i + batch, None] + np.arange(seq_len + 1)
                tokens = torch.from_numpy(np.asarray(val)[offsets].astype(np.int64))
                if self.pipeline is None:
                    logits: torch.Tensor | None = self.module(tokens[:, :-1])
                else:
                    logits = pipeline_forward(self.modules, self.shapes, self.stage, list(range(self.stages)),
                                              tokens[:, :-1] if self.has_first else None, len(tokens))
                if logits is not None:
                    total += float(lm_loss(logits, tokens[:, 1:])) * tokens[:, 1:].numel()
                    count += tokens[:, 1:].numel()
        self.module.train()
        return total / count if count else None
