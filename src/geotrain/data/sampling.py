"""Training batches as a pure function of (data seed, step, replica): resume and re-plans see the same data.

The global batch of a step is `global_batch` windows of seq_len + 1 ids whose start offsets are
drawn from numpy's PCG64 seeded with the SeedSequence (seed, step), nothing else. Replica r of R
takes windows [r * B/R, (r + 1) * B/R) of it, so re-planning from R to R' replicas (any R' dividing
the global batch) or resuming at step k trains on exactly the same windows.
"""

from __future__ import annotations

import numpy as np
import torch

from geotrain.data.sources import DataError


def window_starts(seed: int, step: int, n_tokens: int, seq_len: int, global_batch: int) -> np.ndarray:
    """Start offsets (int64, shape (global_batch,)) of step `step`'s windows, each in 0..n_tokens - seq_len - 1."""
    if seed < 0 or step < 0:
        raise DataError(f"data seed and step must be >= 0, got seed={seed}, step={step}")
    if seq_len < 1 or global_batch < 1:
        raise DataError(f"seq_len and global batch must be >= 1, got {seq_len}, {global_batch}")
    if n_tokens < seq_len + 1:
        raise DataError(f"need at least seq_len + 1 = {seq_len + 1} training tokens, got {n_tokens}")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, step])))
    return rng.integers(0, n_tokens - seq_len, size=global_batch, dtype=np.int64)


def replica_batch(tokens: np.ndarray, seed: int, step: int, replica: int, replicas: int, global_batch: int,
                  seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets (int64, (global_batch / replicas, seq_len)) of `replica` at `step`."""
    if replicas < 1 or not 0 <= replica < replicas:
        raise DataError(f"replica {replica} outside 0..{replicas - 1}")
    if global_batch % replicas:
        raise DataError(f"global batch {global_batch} is not divisible by {replicas} replicas")
    per_replica = global_batch // replicas
    starts = window_starts(seed, step, len(tokens), seq_len, global_batch)[replica * per_replica:
                                                                             (replica + 1) * per_replica]
    windows = torch.from_numpy(np.asarray(tokens)[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64))
    return windows[:, :-1], windows[:, 1:]
