"""Swap search on pairwise cost models, with incremental evaluation (numba kernels).

A placement is kept as a device order: `order[k]` for k < S*R is the device in slot k, i.e.
(stage k // R, replica k % R) as in the seed; `order[k]` for k >= S*R are unused devices.
With the N x N matrices of `PairwiseTerms` (seconds):

    rowsum[s, r] = sum_{r'} dp_pair[order[s*R + r], order[s*R + r']]   (one member's all-reduce time)
    dp_stage[s]  = max_r rowsum[s, r]
    pp_rep[r]    = sum_{s < S-1} pp_pair[order[s*R + r], order[(s+1)*R + r]]
    total        = max_s dp_stage[s] + max_r pp_rep[r]

Swapping two positions changes at most two stage groups and two replicas, so `swap_search` does
O(R + S) work per proposal (row sums of the touched groups move by one difference each), against
O(S R^2) for `swap_search_full`, the compiled full recompute kept as a baseline.

Proposals are pre-drawn by the caller (first: a slot in 0..S*R-1; second: any other position in
0..N-1, an unused device when >= S*R), so kernels hold no RNG and results are bit-for-bit seeded.
Acceptance compares with a relative tolerance `rel_tol` so that float noise in sums of equal
terms is never taken for a real improvement (strict) or a real loss (sideways).
"""

from __future__ import annotations

import numpy as np
from numba import njit

ACCEPT_SIDEWAYS = 0  # accept new <= current (equal cost too): walks across plateaus
ACCEPT_STRICT = 1  # accept new < current only
ACCEPT_ALL = 2  # accept every proposal (a random walk; used to test incremental == full)
REL_TOL = 1e-12


@njit(cache=True)
def init_state(dp_pair, pp_pair, order, stages, replicas):
    """(rowsum (S, R), dp_stage (S,), pp_rep (R,)) in seconds for the placement `order`."""
    rowsum = np.zeros((stages, replicas))
    dp_stage = np.zeros(stages)
    pp_rep = np.zeros(replicas)
    for s in range(stages):
        base = s * replicas
        for r in range(replicas):
            d = order[base + r]
            acc = 0.0
            for q in range(replicas):
                acc += dp_pair[d, order[base + q]]
            rowsum[s, r] = acc
        dp_stage[s] = rowsum[s].max()
    for r in range(replicas):
        pp_rep[r] = _replica_pp(pp_pair, order, r, stages, replicas)
    return rowsum, dp_stage, pp_rep


@njit(cache=True)
def full_total(dp_pair, pp_pair, order, stages, replicas):
    """Total seconds of `order`, recomputed from scratch: O(S R^2)."""
    dp = 0.0
    for s in range(stages):
        base = s * replicas
        for r in range(replicas):
            d = order[base + r]
            acc = 0.0
            for q in range(replicas):
                acc += dp_pair[d, order[base + q]]
            dp = max(dp, acc)
    pp = 0.0
    for r in range(replicas):
        pp = max(pp, _replica_pp(pp_pair, order, r, stages, replicas))
    return dp + pp


@njit(cache=True)
def _replica_pp(pp_pair, order, r, stages, replicas):
    acc = 0.0
    for s in range(stages - 1):
        acc += pp_pair[order[s * replicas + r], order[(s + 1) * replicas + r]]
    return acc


@njit(cache=True)
def _replaced_group(dp_pair, order, rowsum, s, r, old, replicas, out):
    """Row sums of group s after slot (s, r) went from device `old` to order[s*R + r]; returns their max."""
    base = s * replicas
    new = order[base + r]
    own = 0.0
    best = 0.0
    for q in range(replicas):
        if q == r:
            continue
        m = order[base + q]
        to_new = dp_pair[m, new]  # == dp_pair[new, m]: the matrices are symmetric
        # difference first: exactly 0 when old and new are alike, so equal placements stay equal
        value = rowsum[s, q] + (to_new - dp_pair[m, old])
        out[q] = value
        own += to_new
        best = max(best, value)
    out[r] = own
    return max(best, own)


@njit(cache=True)
def _accept(new, current, mode, rel_tol):
    if mode == ACCEPT_ALL:
        return True
    if mode == ACCEPT_STRICT:
        return new < current - rel_tol * current
    return new <= current + rel_tol * current


@njit(cache=True)
def swap_search(dp_pair, pp_pair, stages, replicas, order, rowsum, dp_stage, pp_rep,
                first, second, mode, rel_tol, trace):
    """Try the swaps (first[t], second[t]) in turn, keeping accepted ones; state arrays are updated
    in place. Writes the current total after each proposal to `trace` when it is long enough.
    Returns the number of accepted swaps."""
    slots = stages * replicas
    row_a = np.empty(replicas)
    row_b = np.empty(replicas)
    current = dp_stage.max() + pp_rep.max()
    accepted = 0
    for t in range(first.size):
        i = first[t]
        j = second[t]
        d_i = order[i]
        d_j = order[j]
        s_i = i // replicas
        r_i = i % replicas
        order[i] = d_j
        order[j] = d_i
        s_j = -1
        r_j = -1
        if j < slots:
            s_j = j // replicas
            r_j = j % replicas
        dp_a = 0.0
        dp_b = 0.0
        if s_j != s_i:  # same stage: the group keeps its members, only pipelines change
            dp_a = _replaced_group(dp_pair, order, rowsum, s_i, r_i, d_i, replicas, row_a)
            if s_j >= 0:
                dp_b = _replaced_group(dp_pair, order, rowsum, s_j, r_j, d_j, replicas, row_b)
        pp_a = _replica_pp(pp_pair, order, r_i, stages, replicas)
        pp_b = 0.0
        if r_j >= 0 and r_j != r_i:
            pp_b = _replica_pp(pp_pair, order, r_j, stages, replicas)
        new_dp = 0.0
        for s in range(stages):
            value = dp_stage[s]
            if s_j != s_i:
                if s == s_i:
                    value = dp_a
                elif s == s_j:
                    value = dp_b
            new_dp = max(new_dp, value)
        new_pp = 0.0
        for r in range(replicas):
            value = pp_rep[r]
            if r == r_i:
                value = pp_a
            elif r == r_j:
                value = pp_b
            new_pp = max(new_pp, value)
        new = new_dp + new_pp
        if _accept(new, current, mode, rel_tol):
            accepted += 1
            current = new
            if s_j != s_i:
                rowsum[s_i, :] = row_a
                dp_stage[s_i] = dp_a
                if s_j >= 0:
                    rowsum[s_j, :] = row_b
                    dp_stage[s_j] = dp_b
            elif s_j >= 0:  # same group, members trade slots
                held = rowsum[s_i, r_i]
                rowsum[s_i, r_i] = rowsum[s_j, r_j]
                rowsum[s_j, r_j] = held
            pp_rep[r_i] = pp_a
            if r_j >= 0 and r_j != r_i:
                pp_rep[r_j] = pp_b
        else:
            order[i] = d_i
            order[j] = d_j
        if trace.size > t:
            trace[t] = current
    return accepted


@njit(cache=True)
def swap_search_full(dp_pair, pp_pair, stages, replicas, order, first, second, mode, rel_tol):
    """The same walk as `swap_search`, recomputing the total from scratch for every proposal.
    Baseline for benchmarks. Returns (accepted swaps, final total)."""
    current = full_total(dp_pair, pp_pair, order, stages, replicas)
    accepted = 0
    for t in range(first.size):
        i = first[t]
        j = second[t]
        d_i = order[i]
        order[i] = order[j]
        order[j] = d_i
        new = full_total(dp_pair, pp_pair, order, stages, replicas)
        if _accept(new, current, mode, rel_tol):
            accepted += 1
            current = new
        else:
            order[j] = order[i]
            order[i] = d_i
    return accepted, current


def draw_swaps(rng: np.random.Generator, count: int, slots: int, n_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` swap proposals: a slot in 0..slots-1 and a different position in 0..n_devices-1."""
    if slots < 1 or n_devices < 2:
        raise ValueError(f"swaps need >= 1 slot and >= 2 devices, got {slots} slots, {n_devices} devices")
    first = rng.integers(0, slots, size=count, dtype=np.int64)
    second = rng.integers(0, n_devices - 1, size=count, dtype=np.int64)
    second += second >= first  # skip `first` itself: uniform over the other positions
    return first, second
