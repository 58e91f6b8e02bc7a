"""Pipeline schedules from torch.distributed.pipelining, over one replica's pipeline group.

Each rank holds V virtual stages of a replica's pipeline of S x V stages: pp-rank s holds stages
s, s + S, ..., s + (V-1) S (the placement torch's looped schedules expect). GPipe and 1F1B use V = 1;
Interleaved1F1B and LoopedBFS use V >= 2. Stage input/output shapes are given up front (example
tensors, requires_grad=True for activations), so no shape inference runs over the links. torch
moves whatever float tensors the stages output: the activation codec is the dtype a stage casts its
output to (fp32, fp16 or bf16), or a quantising codec's packed bytes in a float32 carrier
(runtime/cut_wire.py); the bytes on the wire are exactly those of that tensor.

`ComputeTimer` (geotrain.sync.base) accumulates the compute seconds of forward and backward chunks (`TimedStage` times
torch's forward_one_chunk / backward_one_chunk, which contain no communication), codecs and the
optimizer. `pipeline_forward` runs inputs through the pipeline without gradients (evaluation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

from geotrain.runtime.pipeline_schedules import PIPELINE_SCHEDULES
from geotrain.runtime.stages import StageShapes
from geotrain.sync.base import ComputeTimer



class TimedStage(PipelineStage):
    """A PipelineStage whose forward and backward chunks (compute only) are timed by `timer`."""

    def __init__(self, *args: Any, timer: ComputeTimer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timer = timer

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        with self.timer:
            return super().forward_one_chunk(*args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        with self.timer:
            return super().backward_one_chunk(*args, **kwargs)


def virtual_stages_of(pp_rank: int, pp_size: int, per_rank: int) -> list[int]:
    """Indices of the virtual stages pp-rank `pp_rank` holds: pp_rank, pp_rank + S, ... (looped placement)."""
    return [pp_rank + k * pp_size for k in range(per_rank)]


def owner_of(virtual_stage: int, pp_size: int) -> int:
    """The pp-rank holding `virtual_stage`."""
    return virtual_stage % pp_size


class Pipeline:
    """This rank's virtual stages of one replica's pipeline, and the torch schedule that runs them."""

    def __init__(self, kind: str, modules: dict[int, torch.nn.Module], shapes: Sequence[StageShapes],
                 microbatches: int, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 group: Any, device: torch.device, timer: ComputeTimer) -> None:
        """`modules`: virtual stage index -> its module (this rank's); `shapes`: every virtual stage's
        shapes (index = virtual stage); `group`: the replica's pipeline process group (pp-rank = stage)."""
        if kind not in PIPELINE_SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(PIPELINE_SCHEDULES)}, got {kind!r}")
        self.n_virtual = len(shapes)
        self.stage_ids = sorted(modules)
        self.stages = [TimedStage(modules[v], v, self.n_virtual, device, input_args=shapes[v].example_input(device),
                                  output_args=shapes[v].example_output(device), group=group, timer=timer)
                       for v in self.stage_ids]
        schedule = PIPELINE_SCHEDULES[kind]
        if schedule.looped:
            self.schedule = schedule.torch_class(self.stages, n_microbatches=microbatches, loss_fn=loss_fn)
        else:
            assert len(self.stages) == 1
            self.schedule = schedule.torch_class(self.stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
        self.has_first = 0 in modules
        self.has_last = self.n_virtual - 1 in modules

    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float | None:
        """One iteration's forward and backward over the micro-batches of `inputs` (this replica's
        batch; first stage only) against `targets` (last stage only). Gradients accumulate in the
        stage parameters, scaled as for the mean loss. Returns the mean micro-batch loss on the
        rank holding the last stage, else None."""
        args = (inputs,) if self.has_first else ()
        if self.has_last:
            losses: list[torch.Tensor] = []
            self.schedule.step(*args, target=targets, losses=losses)
            return float(torch.stack([loss.detach().float() for loss in losses]).mean())
        self.schedule.step(*args)
        return None


def pipeline_forward(modules: dict[int, torch.nn.Module], shapes: Sequence[StageShapes], pp_rank: int,
                     pp_ranks: Sequence[int], inputs: torch.Tensor | None, batch: int) -> torch.Tensor | None:
    """Run `inputs` (token ids, (batch, T); needed by the holder of stage 0) through every virtual stage
    without gradients, handing activations to the next stage's holder (global ranks `pp_ranks`,
    by pp-rank). Returns the last stage's output on its holder, else None. `shapes`: every virtual
    stage's per-micro-batch shapes (what crosses a cut; the first dimension becomes `batch`)."""
    pp_size, n_virtual = len(pp_ranks), len(shapes)
    hidden = inputs
    device = next((p.device for m in modules.values() for p in m.parameters()), torch.device("cpu"))
    with torch.no_grad():
        for v in range(n_virtual):
            holder = owner_of(v, pp_size)
            if holder != pp_rank:
                continue
            previous = owner_of(v - 1, pp_size) if v > 0 else holder
            if v > 0 and previous != pp_rank:
                cut = shapes[v - 1]
                hidden = torch.empty((batch, *cut.output_shape[1:]), dtype=cut.output_dtype, device=device)
                dist.recv(hidden, src=pp_ranks[previous])
            hidden = modules[v](hidden)
            if v + 1 < n_virtual and owner_of(v + 1, pp_size) != pp_rank:
                dist.send(hidden.contiguous(), dst=pp_ranks[owner_of(v + 1, pp_size)])
    return hidden if modules and (n_virtual - 1) in modules else None
