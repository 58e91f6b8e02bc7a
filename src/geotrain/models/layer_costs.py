"""Per-layer costs to split by: parameter counts, or measured forward + backward seconds."""

from __future__ import annotations

import time

import numpy as np
import torch

from geotrain.models.layers import LayerModel, LayerModelError


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_layer_times(model: LayerModel, batch: int, seq_len: int, repeats: int = 3,
                        seed: int = 0) -> np.ndarray:
    """Median forward + backward seconds of each layer (shape (n_layers,)) on random tokens.

    Each layer runs on the previous layer's (detached) output, so its backward is timed alone; one
    untimed warm-up pass comes first. Timings are noisy on shared machines: use them to split, not to test.
    """
    if repeats < 1 or batch < 1 or seq_len < 1:
        raise LayerModelError(f"repeats, batch and seq_len must be >= 1, got {repeats}, {batch}, {seq_len}")
    vocab = model.vocab_size or 2
    device = next((p.device for p in model.as_module().parameters()), torch.device("cpu"))
    tokens = torch.randint(vocab, (batch, seq_len), generator=torch.Generator().manual_seed(seed)).to(device)
    samples = np.zeros((repeats + 1, model.n_layers))
    for rep in range(repeats + 1):
        hidden = tokens
        for index, layer in enumerate(model.layers):
            inputs = hidden.detach().requires_grad_(hidden.is_floating_point())
            _sync(device)
            start = time.perf_counter()
            out = layer(inputs)
            out.backward(torch.ones_like(out) / out.numel())
            _sync(device)
            samples[rep, index] = time.perf_counter() - start
            hidden = out
        model.as_module().zero_grad(set_to_none=True)
    return np.median(samples[1:], axis=0)


def layer_costs(model: LayerModel, by: str = "params", batch: int = 4, seq_len: int = 64) -> np.ndarray:
    """Costs to split `model` by: "params" (parameter counts) or "time" (measured seconds per layer)."""
    if by == "params":
        return model.layer_parameter_counts().astype(np.float64)
    if by == "time":
        return measure_layer_times(model, batch, seq_len)
    raise LayerModelError(f"split cost must be 'params' or 'time', got {by!r}")
