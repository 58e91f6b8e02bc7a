"""Which coordinates a sparse codec sends: exact top-k, sampled-threshold top-k, seeded random-k.

`topk_indices` is the reference (torch.topk of |x|). `approx_topk_indices` follows Deep Gradient
Compression (Lin et al., ICLR 2018): estimate the magnitude threshold of the top k from a random
sample of |x|, keep the candidates above a slightly lower threshold (a safety margin), then run an
exact top-k on the few candidates only. Whenever the candidates number at least k this returns the
exact top-k set (every non-candidate is smaller than every candidate); when the sample was unlucky
it retries with a wider margin and finally falls back to torch.topk, so the result is always k
indices of k largest magnitudes (ties broken arbitrarily). Its cost is one compiled pass over x
(plus a sample of 0.2 %) instead of torch.topk's selection over all n values.

`random_k_indices` draws a uniform k-subset from a generator seeded by (seed, step, n): every
worker that knows the seed and the step draws the same mask without communicating.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

APPROX_MIN_NUMEL = 1 << 16
"""Below this size approx_topk_indices simply calls torch.topk (sampling would not pay off)."""


def topk_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """int64 indices of the k largest |x| of a 1-D tensor (exact, torch.topk; order unspecified)."""
    if k <= 0:
        return torch.empty(0, dtype=torch.int64)
    return torch.topk(x.abs(), k, sorted=False).indices


def approx_topk_indices(x: torch.Tensor, k: int, *, seed: int = 0, sample_fraction: float = 0.002,
                        margin: float = 1.5) -> torch.Tensor:
    """int64 indices of k largest |x| of a 1-D tensor, found through a sampled threshold (see module doc).

    `sample_fraction`: share of x sampled (at least 1024 values; DGC samples 0.1 % to 1 %);
    `margin`: the threshold is set so that about margin * k candidates pass. Deterministic per seed.
    """
    n = x.numel()
    if k <= 0:
        return torch.empty(0, dtype=torch.int64)
    if n < APPROX_MIN_NUMEL or 4 * k >= n:
        return topk_indices(x, k)
    generator = seeded_generator(seed, n)
    sample_size = min(n, max(1024, int(sample_fraction * n)))
    sample = x[torch.randint(n, (sample_size,), generator=generator)].abs()
    values = x.detach().to(torch.float32).contiguous().numpy()
    for widen in (1.0, 4.0):
        # The sample's top share margin * k / n estimates the magnitude above which ~margin * k values lie.
        keep = min(sample_size, math.ceil(sample_size * min(1.0, margin * widen * k / n)))
        threshold = torch.topk(sample, keep, sorted=False).values.min()
        # Room for 2x the expected candidates; more means a degenerate sample (ties): use torch.topk.
        room = np.empty(max(2 * math.ceil(margin * widen * k), k + 1024), dtype=np.int64)
        count = _indices_at_least(values, _magnitude_bits(float(threshold)), room)
        if count < 0:
            break
        if count >= k:
            candidates = torch.from_numpy(room[:count])
            # Drop the (count - k) smallest candidates: a top-k of a few values, cheaper than top-k of k.
            drop = torch.topk(x[candidates].abs(), count - k, largest=False, sorted=False).indices
            keep_mask = torch.ones(count, dtype=torch.bool)
            keep_mask[drop] = False
            return candidates[keep_mask]
    return topk_indices(x, k)


def random_k_indices(n: int, k: int, *, seed: int, step: int) -> torch.Tensor:
    """A uniform random k-subset of range(n) as sorted int64 indices, the same for the same (seed, step, n)."""
    if k <= 0:
        return torch.empty(0, dtype=torch.int64)
    if k > n:
        raise ValueError(f"cannot draw {k} distinct indices from {n}")
    generator = seeded_generator(seed, step, n)
    if 4 * k >= n:
        return torch.randperm(n, generator=generator)[:k].sort().values
    # Draw with replacement and keep the first k distinct values in draw order: a uniform k-subset,
    # at O(k log k) instead of randperm's O(n). Collisions are rare (about k^2 / 2n of the draws).
    draws = torch.randint(n, (k + k // 16 + 16,), generator=generator)
    while True:
        unique, inverse = torch.unique(draws, return_inverse=True)
        if unique.numel() >= k:
            break
        draws = torch.cat([draws, torch.randint(n, (k - unique.numel() + 16,), generator=generator)])
    first_seen = torch.full((unique.numel(),), draws.numel(), dtype=torch.int64)
    first_seen.scatter_reduce_(0, inverse, torch.arange(draws.numel()), reduce="amin")
    return unique[first_seen.argsort()[:k]].sort().values


def seeded_generator(*keys: int) -> torch.Generator:
    """A torch CPU generator whose seed mixes all integer keys (numpy SeedSequence), bit-reproducible."""
    state = np.random.SeedSequence([int(key) & 0xFFFFFFFFFFFFFFFF for key in keys]).generate_state(2, np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


def _magnitude_bits(threshold: float) -> int:
    """The int32 bit pattern of float32 |threshold| (for floats >= 0 the bit order is the value order)."""
    return int(np.array([abs(threshold)], dtype=np.float32).view(np.int32)[0])


@njit(cache=True)
def _indices_at_least(values, threshold_bits, out):  # pragma: no cover - compiled
    """Write the indices i with |values[i]| >= threshold into `out`; their count, or -1 if out is too small.

    Compares bit patterns without the sign bit (NaN counts as large, as in torch.topk). One branchy
    pass that is rarely taken: faster than a boolean mask plus nonzero.
    """
    bits = values.view(np.int32)
    count = 0
    for i in range(bits.size):
        if (bits[i] & 0x7FFFFFFF) >= threshold_bits:
            if count == out.size:
                return -1
            out[count] = i
            count += 1
    return count
