"""Peak GPU memory of each pipeline stage of a job, in bytes (1 GB = 1e9 B).

Per device of stage s holding L_s layers (L_s = layers/S for the even split, layers x f_s for an
uneven split with shares f_s, `cost.layer_split`):
  params_s  = L_s x per_layer + vocab x hidden on stage 0 (embedding) and on stage S-1 when S > 1
              (the output head's copy of the tied embedding, as Megatron-LM keeps it);
              per_layer = (params - vocab x hidden) / layers.
  states_s  = params_s x state bytes/param: mixed-precision Adam keeps fp16 weights (2) + fp16
              gradients (2) + fp32 master weights, momentum and variance (12) = 16 bytes/param
              (Rajbhandari et al., "ZeRO", SC 2020, Sec. 3.1: 2 + 2 + K with K = 12). ZeRO-style
              sharding over the R devices of the stage's DP group (`zero`): 1 shards the optimizer
              state (2 + 2 + 12/R), 2 also the gradients (2 + 14/R), 3 also the weights (16/R).
  acts_s    = in-flight micro-batches x L_s x act_per_layer, act_per_layer = 34 x seq x b x
              hidden bytes for a micro-batch of b sequences (Korthikanti et al., "Reducing Activation
              Recomputation in Large Transformer Models", MLSys 2023, Sec. 4.1: s b h (34 + 5 a s / h),
              the attention-score term dropped as FlashAttention does not store the scores).
              With `recompute` (full activation checkpointing): 2 s b h per layer kept per in-flight
              micro-batch, plus one layer's 34 s b h while it is recomputed.
              In flight at stage s: 1F1B min(M, S - s) micro-batches (Narayanan et al., PipeDream-Flush
              / Megatron-LM 2021), GPipe all M (Huang et al. 2019).
  logits    = 4 x seq x b x vocab bytes on stage S-1 (fp32 logits of one micro-batch).
  total_s   = states_s + acts_s (+ logits on the last stage).
Sharded replicas (`shards` K > 1, cost/shards.py: each (stage, replica) slot is K devices of one site running
FSDP2, ZeRO-3 style inside the slot): weights, gradients, optimizer state and the DiLoCo outer state (all in
state bytes/param) are split over the K devices, states_s / K (Rajbhandari et al. Sec. 5.3, "P_os+g+p": memory
/ N_d; Zhao et al., "PyTorch FSDP", VLDB 2023, Sec. 3.2), plus the units FSDP holds gathered at once:
FSDP_GATHERED_UNITS x the largest unit (a layer; the embedding on the stages that hold it) in 16-bit weights
and 16-bit gradients, 4 bytes/param (the unit being computed and the one prefetched). Activations are not
sharded by FSDP, but a slot's K devices split its micro-batch (FSDP is data parallel inside the slot): each
device holds the activations and logits of b / K sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geotrain.errors import GeotrainError
from geotrain.job import Job

MODELLED_SCHEDULES = ("1f1b", "gpipe")
"""The pipeline schedules the cost models know (micro-batches in flight here, the event simulation
of cost/schedule.py): a subset of the ones geotrain train runs (runtime.pipeline.PIPELINE_SCHEDULES)."""
OUTER_STATE_BYTES_PER_PARAM = 8.0
"""DiLoCo / local SGD's outer optimizer state per parameter: the fp32 anchor (the last synchronised model) and the
fp32 outer momentum (geotrain.optim.outer), beside the inner optimizer's state."""
OUTER_RESIDUAL_BYTES_PER_PARAM = 4.0
"""The fp32 error-feedback residual of a compressed outer gradient (a codec with error feedback, e.g. int8-block)."""
RECIPE_OUTER_BYTES_PER_PARAM = OUTER_STATE_BYTES_PER_PARAM + OUTER_RESIDUAL_BYTES_PER_PARAM
"""What a WAN recipe's outer sync holds per parameter at most (anchor, momentum, residual): the planner's memory checks
count it before the recipe's codec is chosen (measured per rank by `train --json`'s summary.memory: 28 bytes per
parameter with AdamW and int8-block, runtime/memory_use.py). A device holds none of it when the run keeps its outer
state in host memory (`plan --outer-state host`, `train --outer-state host`: summary.memory's `host`)."""
FSDP_GATHERED_UNITS = 2
"""Units (layers) FSDP holds unsharded at once on a device: the one computing and the one prefetched."""
ACT_BYTES_PER_TOKEN_HIDDEN = 34.0
"""Korthikanti et al. 2023: bytes of stored activations per layer per token per hidden unit (fp16)."""
OUTER_STATES = ("device", "host")
"""Where a run keeps DiLoCo's outer state (train/plan --outer-state): beside the parameters, counted in each
device's memory, or in host memory, not counted (geotrain.optim.outer_state moves it; here, torch-free, for the
planner and the command line)."""


class MemoryConfigError(GeotrainError, ValueError):
    """An invalid memory-model knob."""


@dataclass(frozen=True)
class MemoryConfig:
    """state_bytes_per_param: weights + gradients + optimizer state (16: mixed-precision Adam);
    zero: 0 (none) .. 3 ZeRO-style sharding across each stage's DP group; recompute: full activation
    checkpointing; schedule: "1f1b" or "gpipe" (sets the micro-batches in flight)."""

    state_bytes_per_param: float = 16.0
    zero: int = 0
    recompute: bool = False
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise MemoryConfigError(f"--zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.schedule not in MODELLED_SCHEDULES:
            raise MemoryConfigError(f"--schedule must be one of {', '.join(MODELLED_SCHEDULES)}, got {self.schedule!r}")
        if not (self.state_bytes_per_param >= 4.0):
            raise MemoryConfigError(f"state bytes per parameter must be >= 4, got {self.state_bytes_per_param!r}")


def state_bytes_per_param(config: MemoryConfig, replicas: int) -> float:
    """Bytes of weights + gradients + optimizer state per parameter on one device of a DP group of `replicas`."""
    total = config.state_bytes_per_param
    optimizer = total - 4.0  # fp16 weights and gradients are 2 + 2 of the total
    if config.zero == 0:
        return total
    if config.zero == 1:
        return 4.0 + optimizer / replicas
    if config.zero == 2:
        return 2.0 + (optimizer + 2.0) / replicas
    return total / replicas


def stage_layers(job: Job, stages: int, layer_shares: np.ndarray | None = None) -> np.ndarray:
    """(S,) layers of each stage: layers / S, or layers x each stage's share (an uneven split,
    `cost.layer_split`: S fractions summing to 1)."""
    if layer_shares is None:
        return np.full(stages, job.layers / stages)
    shares = np.asarray(layer_shares, dtype=np.float64)
    if shares.shape != (stages,) or np.any(shares < 0) or abs(float(shares.sum()) - 1.0) > 1e-9:
        raise MemoryConfigError(f"layer shares must be {stages} fractions >= 0 summing to 1 (the plan's split), "
                                f"got {np.ravel(shares)[:8].tolist()}")
    return shares * job.layers


def stage_params(job: Job, stages: int, layer_shares: np.ndarray | None = None) -> np.ndarray:
    """(S,) parameters held by each stage (see the module docstring); `layer_shares`: `stage_layers`."""
    embedding = float(job.vocab * job.hidden)
    per_layer = max(job.params - embedding, 0.0) / job.layers
    params = per_layer * stage_layers(job, stages, layer_shares)
    params[0] += embedding
    if stages > 1:
        params[-1] += embedding
    return params


def in_flight_microbatches(stages: int, microbatches: int, schedule: str) -> np.ndarray:
    """(S,) micro-batches whose activations a stage holds at its peak."""
    if schedule == "gpipe":
        return np.full(stages, microbatches)
    return np.minimum(microbatches, stages - np.arange(stages))


def stage_memory_bytes(job: Job, stages: int, replicas: int, microbatches: int, config: MemoryConfig,
                       layer_shares: np.ndarray | None = None, shards: int = 1) -> np.ndarray:
    """(S,) peak bytes on one device of each stage for S stages, R replicas, M micro-batches, K `shards`.
    Micro-batch b = global_batch / (R M) sequences (fractional when it does not divide), b / K per device.
    layer_shares: each stage's fraction of the layers (an uneven split); default 1/S each."""
    sequences = job.global_batch / (replicas * microbatches * shards)
    tokens_hidden = job.seq_len * sequences * job.hidden
    layer_full = ACT_BYTES_PER_TOKEN_HIDDEN * tokens_hidden
    layers_per_stage = stage_layers(job, stages, layer_shares)
    flight = in_flight_microbatches(stages, microbatches, config.schedule)
    if config.recompute:
        acts = flight * layers_per_stage * 2.0 * tokens_hidden + layer_full
    else:
        acts = flight * layers_per_stage * layer_full
    params = stage_params(job, stages, layer_shares)
    memory = params * state_bytes_per_param(config, replicas) / shards + acts
    if shards > 1:
        memory += FSDP_GATHERED_UNITS * 4.0 * fsdp_unit_params(job, stages)
    memory[-1] += 4.0 * job.seq_len * sequences * job.vocab
    return memory


def fsdp_unit_params(job: Job, stages: int) -> np.ndarray:
    """(S,) parameters of the largest FSDP unit of each stage: a layer, or the embedding (vocab x hidden) on
    stage 0 and, when S > 1, on stage S-1."""
    embedding = float(job.vocab * job.hidden)
    units = np.full(stages, max(job.params - embedding, 0.0) / job.layers)
    units[0] = max(units[0], embedding)
    units[-1] = max(units[-1], embedding)
    return units
