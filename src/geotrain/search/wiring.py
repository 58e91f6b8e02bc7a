"""Re-wire pipelines for fixed DP groups: choose the stage order and the replica matching between
adjacent stages to minimise the slowest replica (the "max-of-replicas" half of the objective).

The DP groups (rows of the assignment, as sets) and hence every dp_s stay as they are; only which
group serves which stage position and which devices of adjacent groups are chained change.
- Stage order: the current one, and either every order (up to reversal, when S!/2 is small) or the
  open path through the groups that minimises the sum of the bottleneck matching values between
  consecutive groups (as DT-FM's scheduler orders stages).
- Matching: for an order, chains are built greedily stage by stage from either end (bottleneck
  assignment of "chain so far + next link"), then every cut is re-matched with both sides known: pairing prefix i
  with suffix j costs P_i + pp(i, j) + Q_j, and the bottleneck assignment (ties: least sum) of that
  matrix can only lower the slowest chain. Sweeps repeat while the (max, sum) of chains improves.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from geotrain.cost.dtfm import min_sum_open_path
from geotrain.cost.matching import bottleneck_assignment, bottleneck_value


def chain_seconds(pp_pair: np.ndarray, assignment: np.ndarray) -> np.ndarray:
    """(R,) pipeline seconds of every replica (column) of `assignment`."""
    if assignment.shape[0] < 2:
        return np.zeros(assignment.shape[1])
    return pp_pair[assignment[:-1], assignment[1:]].sum(axis=0)


def _key(pp_pair: np.ndarray, assignment: np.ndarray) -> tuple[float, float]:
    chains = chain_seconds(pp_pair, assignment)
    return float(chains.max()), float(chains.sum())


def _sweep_cuts(pp_pair: np.ndarray, wired: np.ndarray, max_sweeps: int, cuts: list[int] | None = None) -> np.ndarray:
    """Re-match the given cuts (default: all) with known prefixes and suffixes while (max, sum) improves."""
    stages = wired.shape[0]
    best = _key(pp_pair, wired)
    for _ in range(max_sweeps):
        improved = False
        for k in (range(stages - 1) if cuts is None else cuts):
            links = pp_pair[wired[:-1], wired[1:]]  # (S-1, R)
            prefix = links[:k].sum(axis=0)
            suffix = links[k + 1:].sum(axis=0)
            cost = prefix[:, None] + pp_pair[np.ix_(wired[k], wired[k + 1])] + suffix[None, :]
            _, perm = bottleneck_assignment(cost)
            candidate = wired.copy()
            candidate[k + 1:] = wired[k + 1:, perm]
            key = _key(pp_pair, candidate)
            if key < best:
                wired, best, improved = candidate, key, True
        if not improved:
            break
    return wired


def rematch_rows(pp_pair: np.ndarray, assignment: np.ndarray, rows: set[int]) -> np.ndarray:
    """Re-match only the cuts next to the given stage rows (one sweep): a cheap partial rewire."""
    cuts = sorted({k for s in rows for k in (s - 1, s) if 0 <= k < assignment.shape[0] - 1})
    return _sweep_cuts(pp_pair, assignment, 1, cuts) if cuts else assignment


def _greedy_chains(pp_pair: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Chains grown stage by stage: each step a bottleneck assignment of prefix + next link."""
    wired = np.empty_like(groups)
    wired[0] = groups[0]
    prefix = np.zeros(groups.shape[1])
    for k in range(1, groups.shape[0]):
        cost = prefix[:, None] + pp_pair[np.ix_(wired[k - 1], groups[k])]
        _, perm = bottleneck_assignment(cost)
        wired[k] = groups[k][perm]
        prefix = prefix + pp_pair[wired[k - 1], wired[k]]
    return wired


def best_stage_order(pp_pair: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """The order of the groups (rows) minimising the sum of bottleneck matching values between neighbours."""
    stages = groups.shape[0]
    cut = np.zeros((stages, stages))
    for s in range(stages):
        for t in range(s + 1, stages):
            cut[s, t] = cut[t, s] = bottleneck_value(np.ascontiguousarray(pp_pair[np.ix_(groups[s], groups[t])]))[0]
    return min_sum_open_path(cut)[1]


def _orders(pp_pair: np.ndarray, groups: np.ndarray, max_orders: int) -> list[np.ndarray]:
    """Stage orders to try: every order up to reversal when there are at most `max_orders`, else
    the best open path of bottleneck values."""
    stages = groups.shape[0]
    if math.factorial(stages) // 2 <= max_orders:
        return [np.array(p) for p in itertools.permutations(range(stages)) if p[0] < p[-1]]
    return [best_stage_order(pp_pair, groups)]


def rewire(pp_pair: np.ndarray, assignment: np.ndarray, max_sweeps: int = 4, max_orders: int | None = None) -> np.ndarray:
    """The same DP groups, re-ordered and re-matched; never slower (max, then sum of chains) than the input.

    Tries the current wiring and, for each candidate stage order, chains grown greedily from either
    end; `max_orders` (default: 12 when R <= 16, else 1) caps exhaustive stage orders.
    """
    assignment = np.asarray(assignment, dtype=np.int64)
    if assignment.shape[0] < 2:
        return assignment.copy()
    if max_orders is None:
        max_orders = 12 if assignment.shape[1] <= 16 else 1
    candidates = [_sweep_cuts(pp_pair, assignment, max_sweeps)]
    for order in _orders(pp_pair, assignment, max_orders):
        forward = _greedy_chains(pp_pair, assignment[order])
        backward = _greedy_chains(pp_pair, assignment[order[::-1]])[::-1]
        candidates += [_sweep_cuts(pp_pair, forward, max_sweeps), _sweep_cuts(pp_pair, backward, max_sweeps)]
    keys = [_key(pp_pair, c) for c in candidates]
    return candidates[int(min(range(len(keys)), key=keys.__getitem__))]
