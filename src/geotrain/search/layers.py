"""The layered-composition lower bound: strong for many replicas, where the path MILP has too many paths.

A stage's DP group is a region composition x (counts per region summing to R) with
dp(x) = max over present regions of f_g(x) (see `regions`). Only compositions with
dp(x) <= U - PP_min can appear in a plan better than a known plan of total U (PP_min: the cheapest
region path), and there are few of them when groups must stay (nearly) inside regions.

MILP: binary c[s, k] = "stage s has composition k"; continuous q[s, k, l] = "stage s has k and stage
s+1 has l" (only for pairs that fit the region capacities together); DP >= sum_k dp_k c[s, k];
capacities sum_s sum_k x_k[g] c[s, k] <= |g|; and PP >= sum_s sum_{k,l} T(k, l) q[s, k, l] / R, where
T(k, l) is the cheapest transport of the R replicas from composition k to l over the region pp
matrix: the mean replica's pipeline seconds, a lower bound on the slowest one. Minimising DP + PP
gives a lower bound on the optimum (exact when all replicas of an optimal plan cost the same).
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import linprog

from geotrain.search.milp import MilpResult, _Rows, _bound, _solve, _status
from geotrain.search.regions import RegionTerms

NODE_BUDGET = 300_000
"""Search nodes of the composition enumeration before giving up (returns None)."""


def enumerate_compositions(terms: RegionTerms, replicas: int, cap_s: float, max_count: int) -> np.ndarray | None:
    """All (K, G) region compositions of R devices (within region sizes) whose dp <= cap_s, or None
    when there are more than `max_count` or the search exceeds NODE_BUDGET nodes."""
    G, W = terms.n_regions, terms.dp_s
    sizes = np.minimum(terms.sizes, replicas)
    # tail_min[h, g]: the cheapest pair cost from region h to any region >= g
    tail_min = np.full((G, G + 1), np.inf)
    for g in range(G - 1, -1, -1):
        tail_min[:, g] = np.minimum(tail_min[:, g + 1], W[:, g])
    capacity_after = np.concatenate([np.cumsum(sizes[::-1])[::-1], [0]])
    found: list[np.ndarray] = []
    counts = np.zeros(G, dtype=np.int64)
    partial = np.zeros(G)  # partial[h] = sum_k counts[k] W[h, k] over regions placed so far
    nodes = 0
    slack = 1e-12 * max(1.0, cap_s)

    def walk(g: int, left: int) -> bool:
        nonlocal nodes
        nodes += 1
        if nodes > NODE_BUDGET or len(found) > max_count:
            return False
        present = counts[:g] > 0
        if present.any():
            floor = partial[:g] - np.diag(W)[:g] + (left * tail_min[:g, g] if left else 0.0)
            if (floor[present] > cap_s + slack).any():
                return True
        if g == G:
            if left == 0:
                found.append(counts.copy())
            return True
        if left > capacity_after[g]:
            return True
        for count in range(min(left, int(sizes[g])), -1, -1):
            counts[g] = count
            partial[:] += count * W[:, g]
            ok = walk(g + 1, left - count)
            partial[:] -= count * W[:, g]
            if not ok:
                counts[g] = 0
                return False
        counts[g] = 0
        return True

    if not walk(0, replicas) or len(found) > max_count:
        return None
    return np.array(found, dtype=np.int64).reshape(-1, G)


def transport_seconds(pp_s: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """Cheapest sum_{g,h} pp[g, h] n[g, h] over n >= 0 with row sums a and column sums b."""
    rows, cols = np.flatnonzero(a), np.flatnonzero(b)
    cost = pp_s[np.ix_(rows, cols)]
    if rows.size == 1 or cols.size == 1:
        return float((cost * (b[cols][None, :] if rows.size == 1 else a[rows][:, None])).sum())
    if rows.size == 2 and cols.size == 2:
        (a1, a2), (b1, _) = a[rows], b[cols]
        ends = (max(0, b1 - a2), min(a1, b1))
        return float(min(cost[0, 0] * t + cost[0, 1] * (a1 - t) + cost[1, 0] * (b1 - t) + cost[1, 1] * (a2 - b1 + t)
                         for t in ends))
    m, n = rows.size, cols.size
    equality = np.zeros((m + n, m * n))
    for i in range(m):
        equality[i, i * n:(i + 1) * n] = 1.0
    for j in range(n):
        equality[m + j, j::n] = 1.0
    result = linprog(cost.ravel(), A_eq=equality, b_eq=np.concatenate([a[rows], b[cols]]).astype(float),
                     bounds=(0, None), method="highs")
    return float(result.fun)


def solve_layer_milp(terms: RegionTerms, stages: int, replicas: int, compositions: np.ndarray,
                     time_limit_s: float | None = None) -> MilpResult:
    """The layered-composition MILP (see the module docstring); its bound is a lower bound.

    Reversing the stage order maps a plan to one of equal cost, so stage 0's composition index is
    kept <= stage S-1's.
    """
    start = time.perf_counter()
    K, G = compositions.shape
    dp = terms.group_seconds(compositions)
    fits = (compositions[:, None, :] + compositions[None, :, :] <= terms.sizes[None, None, :]).all(axis=-1)
    pairs = np.argwhere(fits)
    moves = np.array([transport_seconds(terms.pp_s, compositions[k], compositions[l]) for k, l in pairs]) / replicas
    cuts, P = max(stages - 1, 0), len(pairs)
    q0 = stages * K
    dp_col, pp_col = q0 + cuts * P, q0 + cuts * P + 1
    n_vars = pp_col + 1
    rows = _Rows()
    for s in range(stages):
        rows.add({s * K + k: 1.0 for k in range(K)}, 1.0, 1.0)
        coefficients = {s * K + k: -float(dp[k]) for k in range(K)}
        coefficients[dp_col] = 1.0
        rows.add(coefficients, 0.0, np.inf)
    for g in range(G):
        rows.add({s * K + k: float(compositions[k, g]) for s in range(stages) for k in np.flatnonzero(compositions[:, g])},
                 -np.inf, float(terms.sizes[g]))
    for s in range(cuts):
        base = q0 + s * P
        for k in range(K):
            out = {base + int(i): 1.0 for i in np.flatnonzero(pairs[:, 0] == k)}
            out[s * K + k] = -1.0
            rows.add(out, 0.0, 0.0)
            into = {base + int(i): 1.0 for i in np.flatnonzero(pairs[:, 1] == k)}
            into[(s + 1) * K + k] = -1.0
            rows.add(into, 0.0, 0.0)
    mean = {q0 + s * P + i: -float(moves[i]) for s in range(cuts) for i in range(P)}
    mean[pp_col] = 1.0
    rows.add(mean, 0.0, np.inf)
    if stages > 1:
        order = {k: float(k) for k in range(K)}
        order.update({(stages - 1) * K + k: -float(k) for k in range(K)})
        rows.add(order, -np.inf, 0.0)
    c = np.zeros(n_vars)
    c[dp_col] = c[pp_col] = 1.0
    integrality = np.zeros(n_vars)
    integrality[:q0] = 1
    upper = np.concatenate([np.ones(q0 + cuts * P), [np.inf, np.inf]])
    left = None if time_limit_s is None else max(0.1, time_limit_s - (time.perf_counter() - start))
    result, seconds = _solve(c, rows, integrality, upper, n_vars, left)
    status = _status(result)
    counts = None
    if result.x is not None and status != "infeasible":
        chosen = np.rint(result.x[:q0]).reshape(stages, K).argmax(axis=1)
        counts = compositions[chosen]
    # infeasible can only be numerical (the plan that gave U fits): report no information
    return MilpResult(status, float(result.fun) if result.x is not None else None,
                      _bound(result) if status != "infeasible" else 0.0, counts, None,
                      time.perf_counter() - start, n_vars)
