"""Bottleneck (min-max) assignment and bottleneck rings: the combinatorial kernels of the
"ring" and "dtfm" cost models and of the hierarchical search.

- `bottleneck_assignment(cost)`: a permutation p minimising max_i cost[i, p[i]] (exact: binary
  search over the sorted entries, each threshold checked by a perfect matching), optionally the
  cheapest-sum permutation among the bottleneck-optimal ones (scipy's linear_sum_assignment).
- `bottleneck_ring(weight)`: a cyclic order of n nodes minimising its largest edge (bottleneck
  TSP): exact by dynamic programming over subsets for n <= EXACT_RING_MAX, beyond that the best of
  nearest-neighbour tours improved by 2-opt moves that remove a largest edge.
"""

from __future__ import annotations

import numpy as np
from numba import njit

EXACT_RING_MAX = 10
"""Largest ring solved exactly (2^n x n^2 work: ~0.1 M operations at n = 10)."""


@njit(cache=True)
def _perfect_matching(allowed: np.ndarray, match_of_row: np.ndarray) -> bool:
    """Kuhn's augmenting paths (BFS) on a boolean n x n matrix; fills match_of_row; False if none."""
    n = allowed.shape[0]
    row_of_col = np.full(n, -1, dtype=np.int64)
    match_of_row[:] = -1
    parent = np.empty(n, dtype=np.int64)
    seen = np.empty(n, dtype=np.bool_)
    queue = np.empty(n, dtype=np.int64)
    for root in range(n):
        seen[:] = False
        queue[0] = root
        head, tail, found = 0, 1, -1
        while head < tail and found < 0:
            row = queue[head]
            head += 1
            for col in range(n):
                if allowed[row, col] and not seen[col]:
                    seen[col] = True
                    parent[col] = row
                    if row_of_col[col] < 0:
                        found = col
                        break
                    queue[tail] = row_of_col[col]
                    tail += 1
        if found < 0:
            return False
        col = found
        while col >= 0:
            row = parent[col]
            previous = match_of_row[row]
            match_of_row[row] = col
            row_of_col[col] = row
            col = previous
    return True


@njit(cache=True)
def bottleneck_value(cost: np.ndarray) -> tuple[float, np.ndarray]:
    """(min over permutations p of max_i cost[i, p[i]], one such p). cost: n x n, n >= 1."""
    n = cost.shape[0]
    values = np.unique(cost.ravel())
    match = np.empty(n, dtype=np.int64)
    lo, hi = 0, values.size - 1
    # the answer is at least the largest row minimum and the largest column minimum
    floor = -np.inf
    for i in range(n):
        floor = max(floor, cost[i].min(), cost[:, i].min())
    lo = np.searchsorted(values, floor)
    best = np.empty(n, dtype=np.int64)
    while lo < hi:
        mid = (lo + hi) // 2
        if _perfect_matching(cost <= values[mid], match):
            hi = mid
        else:
            lo = mid + 1
    _perfect_matching(cost <= values[lo], best)
    return values[lo], best


def bottleneck_assignment(cost: np.ndarray, refine_sum: bool = True) -> tuple[float, np.ndarray]:
    """(bottleneck value, perm) with perm[i] the column of row i; with `refine_sum`, perm also
    minimises sum_i cost[i, perm[i]] among the permutations that reach the bottleneck value."""
    cost = np.ascontiguousarray(cost, dtype=np.float64)
    value, perm = bottleneck_value(cost)
    if refine_sum and cost.shape[0] > 1:
        span = float(np.abs(cost).max()) + 1.0
        masked = np.where(cost <= value, cost, span * (cost.shape[0] + 1))
        from scipy.optimize import linear_sum_assignment  # here: every launched rank imports this module

        rows, cols = linear_sum_assignment(masked)
        perm = np.empty(cost.shape[0], dtype=np.int64)
        perm[rows] = cols
    return float(value), perm


@njit(cache=True)
def subset_path_order(back: np.ndarray, last: int) -> np.ndarray:
    """Walk the back-pointers of a DP over subsets (back[mask, node] = previous node) from the full
    set ending at `last`; returns the node order of that path."""
    n = back.shape[1]
    order = np.empty(n, dtype=np.int64)
    mask = back.shape[0] - 1
    for position in range(n - 1, -1, -1):
        order[position] = last
        previous = back[mask, last]
        mask ^= 1 << last
        last = previous
    return order


@njit(cache=True)
def _exact_ring(weight: np.ndarray) -> tuple[float, np.ndarray]:
    """Bottleneck Hamiltonian cycle by DP over subsets containing node 0 (n <= ~12); among the
    bottleneck-optimal cycles found, the one with the smallest edge sum breaks ties."""
    n = weight.shape[0]
    full = 1 << n
    best = np.full((full, n), np.inf)
    total = np.full((full, n), np.inf)
    back = np.full((full, n), -1, dtype=np.int64)
    best[1, 0] = 0.0
    total[1, 0] = 0.0
    for mask in range(1, full):
        if not mask & 1:
            continue
        for last in range(n):
            value = best[mask, last]
            if value == np.inf:
                continue
            for nxt in range(1, n):
                if mask & (1 << nxt):
                    continue
                candidate = max(value, weight[last, nxt])
                summed = total[mask, last] + weight[last, nxt]
                grown = mask | (1 << nxt)
                if candidate < best[grown, nxt] or (candidate == best[grown, nxt] and summed < total[grown, nxt]):
                    best[grown, nxt] = candidate
                    total[grown, nxt] = summed
                    back[grown, nxt] = last
    value, summed, last = np.inf, np.inf, 1
    for end in range(1, n):
        candidate = max(best[full - 1, end], weight[end, 0])
        closing = total[full - 1, end] + weight[end, 0]
        if candidate < value or (candidate == value and closing < summed):
            value, summed, last = candidate, closing, end
    order = subset_path_order(back, last)
    return value, order


@njit(cache=True)
def _ring_edges(weight: np.ndarray, order: np.ndarray) -> np.ndarray:
    n = order.size
    edges = np.empty(n)
    for k in range(n):
        edges[k] = weight[order[k], order[(k + 1) % n]]
    return edges


@njit(cache=True)
def _two_opt_ring(weight: np.ndarray, order: np.ndarray) -> float:
    """Improve `order` in place by reversals that replace a largest edge with two smaller ones."""
    n = order.size
    while True:
        edges = _ring_edges(weight, order)
        k = int(np.argmax(edges))
        worst = edges[k]
        improved = False
        for j in range(n):
            if j == k or (j + 1) % n == k or (k + 1) % n == j:
                continue
            a, b = order[k], order[(k + 1) % n]
            c, d = order[j], order[(j + 1) % n]
            if max(weight[a, c], weight[b, d]) < worst:
                # reverse the path b .. c (positions k+1 .. j, cyclically)
                i0, i1 = (k + 1) % n, j
                length = (i1 - i0) % n + 1
                for t in range(length // 2):
                    p, q = (i0 + t) % n, (i1 - t) % n
                    order[p], order[q] = order[q], order[p]
                improved = True
                break
        if not improved:
            return worst


@njit(cache=True)
def _heuristic_ring(weight: np.ndarray) -> tuple[float, np.ndarray]:
    n = weight.shape[0]
    best_value, best_order = np.inf, np.arange(n)
    for start in range(min(n, 8)):
        order = np.empty(n, dtype=np.int64)
        used = np.zeros(n, dtype=np.bool_)
        order[0], used[start] = start, True
        for position in range(1, n):
            row = weight[order[position - 1]]
            nxt, nearest = -1, np.inf
            for candidate in range(n):
                if not used[candidate] and row[candidate] < nearest:
                    nxt, nearest = candidate, row[candidate]
            order[position], used[nxt] = nxt, True
        value = _two_opt_ring(weight, order)
        if value < best_value:
            best_value, best_order = value, order.copy()
    return best_value, best_order


@njit(cache=True)
def bottleneck_ring(weight: np.ndarray) -> tuple[float, np.ndarray]:
    """(largest edge of the best cyclic order found, the order). n = 1: (0, [0]); n = 2: the one edge."""
    n = weight.shape[0]
    if n == 1:
        return 0.0, np.zeros(1, dtype=np.int64)
    if n == 2:
        return weight[0, 1], np.arange(2)
    if n <= EXACT_RING_MAX:
        return _exact_ring(weight)
    return _heuristic_ring(weight)


@njit(cache=True)
def group_ring_bottlenecks(groups: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Bottleneck ring value of every row of `groups` (G, n) of device indices into `weight`."""
    out = np.empty(groups.shape[0])
    n = groups.shape[1]
    sub = np.empty((n, n))
    for g in range(groups.shape[0]):
        for i in range(n):
            for j in range(n):
                sub[i, j] = weight[groups[g, i], groups[g, j]]
        out[g] = bottleneck_ring(sub)[0]
    return out
