"""Before launching: does one training sequence fit the model and the memory of this machine?

A TinyGPT preset widens its context to --seq-len, so there the limit is memory: the activations a
rank keeps for backward, per layer and in-flight micro-batch, are about 68 x seq x b x d_model bytes
in fp32 (Korthikanti et al., MLSys 2023, Sec. 4.1: 34 s b h in fp16; the attention scores are not
stored, scaled_dot_product_attention does not keep them), plus the fp32 logits (4 x seq x b x vocab)
on the last stage. In flight: GPipe and the looped schedules all M micro-batches, 1F1B min(M, S).
On the CPU every rank of this machine shares its available memory (/proc/meminfo MemAvailable);
on a GPU each rank has its device's memory. A model loaded from a spec (hf:, file.py:fn) is checked
for its own context by the workers, once built.
"""

from __future__ import annotations

import math
from pathlib import Path

from geotrain.errors import GeotrainError
from geotrain.runtime.config import RuntimeConfig

ACT_BYTES_PER_TOKEN_HIDDEN_FP32 = 68.0
"""Stored activation bytes per layer, token and hidden unit in fp32 (twice Korthikanti's fp16 34)."""


class SequenceTooLongError(GeotrainError, ValueError):
    """--seq-len does not fit the model's context or this machine's memory."""


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where the file is missing or unreadable."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def activation_bytes_per_rank(config: RuntimeConfig) -> float:
    """Peak stored activations (bytes) of the busiest rank of a TinyGPT preset run (module docstring)."""
    model = config.model.gpt
    layers = model.n_layer + 2  # embedding, blocks, head
    per_rank = math.ceil(layers / config.stages)
    looped = config.schedule.schedule != "1f1b"
    microbatches = config.schedule.microbatches
    in_flight = microbatches if looped else min(microbatches, config.stages)
    tokens = config.sequence_length * config.microbatch_size
    logits = 4.0 * tokens * max(model.vocab_size, 256)  # the data's vocabulary may widen the preset's
    return ACT_BYTES_PER_TOKEN_HIDDEN_FP32 * tokens * model.d_model * per_rank * in_flight + logits


def check_sequence_fits(config: RuntimeConfig, available_bytes: int | None = None) -> None:
    """SequenceTooLongError, in one line, when a preset run's activations at --seq-len exceed the
    memory they would share (`available_bytes`: this machine's available memory on the CPU, by
    default read from /proc/meminfo; the device's on a GPU). Specs other than presets pass."""
    if not config.model.preset:
        return
    need = activation_bytes_per_rank(config)
    if config.run.device.startswith("cuda"):
        import torch

        if available_bytes is None and torch.cuda.is_available():
            available_bytes = torch.cuda.get_device_properties(0).total_memory
        where = "each GPU's memory"
    else:
        need *= config.world_size  # the ranks of this machine share its memory
        available_bytes = available_memory_bytes() if available_bytes is None else available_bytes
        where = f"the memory available on this machine for {config.world_size} ranks"
    if available_bytes is not None and need > available_bytes:
        raise SequenceTooLongError(
            f"--seq-len {config.sequence_length}: model {config.model.model_name!r} (d_model {config.model.gpt.d_model}) would "
            f"keep about {need / 1e9:.1f} GB of activations, more than {where} ({available_bytes / 1e9:.1f} GB); "
            f"use a shorter --seq-len or a smaller --batch-size")
