"""Measure a model's training step on this machine (`geotrain calibrate`): what cost.calibration records.

A step is what a replica of one stage computes in `geotrain train`: forward over `batch` sequences of `seq_len`
tokens, the language-model loss, backward and an AdamW step. `warmup` steps run first, untimed (allocations,
kernel selection); each of the `steps` after is timed alone, with the device's queue drained (torch.cuda
.synchronize on a GPU) before and after.
"""

from __future__ import annotations

import time

import torch

from geotrain.models.layers import LayerModel, LayerModelError, lm_loss


def measure_step_seconds(model: LayerModel, batch: int, seq_len: int, steps: int = 5, warmup: int = 2,
                         device: str = "cpu", seed: int = 0) -> tuple[float, ...]:
    """Seconds of each of `steps` timed training steps of `model` on `device` (see the module doc)."""
    if batch < 1 or seq_len < 1 or steps < 1 or warmup < 0:
        raise LayerModelError(f"calibrate: batch, seq_len and steps must be >= 1 and warmup >= 0, got {batch}, "
                              f"{seq_len}, {steps}, {warmup}")
    module = model.as_module().to(device)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
    vocab = model.vocab_size or 2
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(vocab, (batch, seq_len + 1), generator=generator).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def drain() -> None:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)

    seconds = []
    for index in range(warmup + steps):
        drain()
        start = time.perf_counter()
        loss = lm_loss(module(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        drain()
        if index >= warmup:
            seconds.append(time.perf_counter() - start)
    return tuple(seconds)
