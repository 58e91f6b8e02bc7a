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


WINDOW_MODES = ("random", "epochs")


def window_count(n_tokens: int, seq_len: int, windows: str, limit: int = 0) -> int:
    """How many distinct windows (samples) `windows` draws from n_tokens training ids; `limit` > 0: "epochs"
    uses only the first `limit` aligned windows."""
    if windows == "random":
        return n_tokens - seq_len
    found = (n_tokens - 1) // seq_len
    return min(found, limit) if limit > 0 else found


def window_ids(seed: int, step: int, n_tokens: int, seq_len: int, global_batch: int,
               windows: str = "random", limit: int = 0) -> np.ndarray:
    """The identities (int64, (global_batch,)) of step `step`'s windows: start offsets ("random") or aligned
    window indices ("epochs", each in 0..window_count - 1; the batch may straddle two epochs)."""
    if windows not in WINDOW_MODES:
        raise DataError(f"data windows must be one of {', '.join(WINDOW_MODES)}, got {windows!r}")
    if windows == "random":
        return window_starts(seed, step, n_tokens, seq_len, global_batch)
    _check(seed, step, n_tokens, seq_len, global_batch)
    n = window_count(n_tokens, seq_len, windows, limit)
    positions = step * global_batch + np.arange(global_batch, dtype=np.int64)
    ids = np.empty(global_batch, dtype=np.int64)
    for epoch in np.unique(positions // n):
        order = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, int(epoch), 1]))).permutation(n)
        here = positions // n == epoch
        ids[here] = order[positions[here] % n]
    return ids


def batch_starts(seed: int, step: int, n_tokens: int, seq_len: int, global_batch: int,
                 windows: str = "random", limit: int = 0) -> np.ndarray:
    """Start offsets (int64, (global_batch,)) of step `step`'s windows drawn as `windows` says."""
    ids = window_ids(seed, step, n_tokens, seq_len, global_batch, windows, limit)
    return ids if windows == "random" else ids * seq_len


def _check(seed: int, step: int, n_tokens: int, seq_len: int, global_batch: int) -> None:
    if seed < 0 or step < 0:
        raise DataError(f"data seed and step must be >= 0, got seed={seed}, step={step}")
    if seq_len < 1 or global_batch < 1:
        raise DataError(f"seq_len and global batch must be >= 1, got {seq_len}, {global_batch}")
    if n_tokens < seq_len + 1:
        raise DataError(f"need at least seq_len + 1 = {seq_len + 1} training tokens, got {n_tokens}")


def window_starts(seed: int, step: int, n_tokens: int, seq_len: int, global_batch: int) -> np.ndarray:
    """Start offsets (int64, shape (global_batch,)) of step `step`'s windows, each in 0..n_tokens - seq_len - 1."""
    _check(seed, step, n_tokens, seq_len, global_batch)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, step])))
    return rng.integers(0, n_tokens - seq_len, size=global_batch, dtype=np.int64)


def replica_batch(tokens: np.ndarray, seed: int, step: int, replica: int, replicas: int, global_batch: int,
                  seq_len: int, windows: str = "random", limit: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets (int64, (global_batch / replicas, seq_len)) of `replica` at `step`."""
    if replicas < 1 or not 0 <= replica < replicas:
        raise DataError(f"replica {replica} outside 0..{replicas - 1}")
    if global_batch % replicas:
        raise DataError(f"global batch {global_batch} is not divisible by {replicas} replicas")
    per_replica = global_batch // replicas
    starts = batch_starts(seed, step, len(tokens), seq_len, global_batch, windows, limit)[replica * per_replica:
                                                                                   (replica + 1) * per_replica]
    rows = torch.from_numpy(np.asarray(tokens)[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64))
    return rows[:, :-1], rows[:, 1:]
