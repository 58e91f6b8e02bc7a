"""The "dtfm" model: how DT-FM's own scheduler (Yuan et al., NeurIPS 2022; DS3Lab/DT-FM,
scheduler/heuristic_evolutionary_solver/scheduler.py) scores a plan.

Traffic: one pipeline of equal cuts (c_pp = traffic.pp_bytes[0]). It looks only at the DP groups (the set of devices serving each stage), not at the given wiring:
  dp   = max_s dp_s, exactly as "yuan" (scatter-gather all-reduce inside each group);
  B(s, t) = min over perfect matchings M of the two groups of max_{(i, j) in M} (a(i,j) + 8 c_pp / b(i,j))
            (the bottleneck one-way activation transfer of the best matching: a synchronous cut);
  pp'  = min over stage orders (open paths through all S groups) of sum of B along the path;
  total = dp + 2 pp'   (forward activations and backward gradients).
Reported: pp = 2 pp', pp_per_replica = 2 x the transfer sum of each replica chain that the best
order and matchings wire (so pp >= max pp_per_replica); extra "stage_order" is not a float and is
returned by `best_order` instead. Stage orders: exact DP over subsets up to S = 15, nearest-neighbour
from every start beyond.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from geotrain.cluster import Cluster
from geotrain.cost.base import CostBreakdown
from geotrain.cost.matching import bottleneck_value, subset_path_order
from geotrain.cost.traffic import Traffic, TrafficError, traffic_of_job
from geotrain.cost.yuan import YuanCostModel, pair_transfer_seconds
from geotrain.job import Job

EXACT_ORDER_MAX = 15


@njit(cache=True)
def min_sum_open_path(weight: np.ndarray) -> tuple[float, np.ndarray]:
    """An order of all nodes minimising the sum of consecutive weights (open path, any start)."""
    n = weight.shape[0]
    if n == 1:
        return 0.0, np.zeros(1, dtype=np.int64)
    if n > EXACT_ORDER_MAX:
        best_value, best_order = np.inf, np.arange(n)
        for start in range(n):
            order = np.empty(n, dtype=np.int64)
            used = np.zeros(n, dtype=np.bool_)
            order[0], used[start], total = start, True, 0.0
            for k in range(1, n):
                nxt, nearest = -1, np.inf
                for c in range(n):
                    if not used[c] and weight[order[k - 1], c] < nearest:
                        nxt, nearest = c, weight[order[k - 1], c]
                order[k], used[nxt] = nxt, True
                total += nearest
            if total < best_value:
                best_value, best_order = total, order
        return best_value, best_order
    full = 1 << n
    best = np.full((full, n), np.inf)
    back = np.full((full, n), -1, dtype=np.int64)
    for v in range(n):
        best[1 << v, v] = 0.0
    for mask in range(1, full):
        for last in range(n):
            value = best[mask, last]
            if value == np.inf:
                continue
            for nxt in range(n):
                if mask & (1 << nxt):
                    continue
                grown = mask | (1 << nxt)
                if value + weight[last, nxt] < best[grown, nxt]:
                    best[grown, nxt] = value + weight[last, nxt]
                    back[grown, nxt] = last
    last = int(np.argmin(best[full - 1]))
    value = best[full - 1, last]
    order = subset_path_order(back, last)
    return value, order


class DtfmCostModel:
    """DT-FM's scheduler objective dp + 2 pp' (see the module docstring)."""

    name = "dtfm"

    def __init__(self, cluster: Cluster, traffic: Traffic) -> None:
        if not traffic.uniform_pp():  # it reorders the stages, so every cut must carry the same bytes
            raise TrafficError(f"cost model 'dtfm' needs one pipeline of equal cuts, got pp_bytes {traffic.pp_bytes}")
        self.groups_model = YuanCostModel(cluster, traffic)
        self.stages, self.replicas, self.n_devices = traffic.stages, traffic.replicas, cluster.n_devices
        cut_bytes = traffic.pp_bytes[0] if traffic.pp_bytes else 0.0
        scale = traffic.wire.byte_scale(cluster, "pp", traffic.bytes_per_value)
        self.transfer_s = np.ascontiguousarray(pair_transfer_seconds(cluster, cut_bytes, scale))
        self.transfer_s.setflags(write=False)

    @classmethod
    def for_job(cls, cluster: Cluster, job: Job, stages: int, replicas: int) -> DtfmCostModel:
        """The model of `job`'s traffic (traffic_of_job) on `stages` x `replicas`."""
        return cls(cluster, traffic_of_job(job, stages, replicas, n_devices=cluster.n_devices))

    def pairwise_terms(self) -> None:
        return None

    def best_order(self, assignment: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """(pp' seconds, stage order, wired (S, R) assignment: row k = the group of order[k],
        columns = replica chains along the best matchings)."""
        assignment = np.asarray(assignment, dtype=np.int64)
        S = self.stages
        cut = np.zeros((S, S))
        perms: dict[tuple[int, int], np.ndarray] = {}
        for s in range(S):
            for t in range(s + 1, S):
                value, perm = bottleneck_value(np.ascontiguousarray(self.transfer_s[np.ix_(assignment[s], assignment[t])]))
                cut[s, t] = cut[t, s] = value
                perms[(s, t)] = perm
        pp_prime, order = min_sum_open_path(cut)
        wired = np.empty_like(assignment)
        wired[0] = assignment[order[0]]
        for k in range(1, S):
            s, t = int(order[k - 1]), int(order[k])
            if s < t:
                perm = perms[(s, t)]  # device position i of s -> position perm[i] of t
                position_of_prev = {int(d): i for i, d in enumerate(assignment[s])}
                wired[k] = [assignment[t][perm[position_of_prev[int(d)]]] for d in wired[k - 1]]
            else:
                perm = perms[(t, s)]  # position i of t -> perm[i] of s
                inverse = np.empty_like(perm)
                inverse[perm] = np.arange(perm.size)
                position_of_prev = {int(d): i for i, d in enumerate(assignment[s])}
                wired[k] = [assignment[t][inverse[position_of_prev[int(d)]]] for d in wired[k - 1]]
        return float(pp_prime), order, wired

    def evaluate(self, assignment: np.ndarray) -> CostBreakdown:
        assignment = np.asarray(assignment, dtype=np.int64)
        dp_per_stage = self.groups_model.stage_dp_seconds(assignment)
        pp_prime, _, wired = self.best_order(assignment)
        chains = 2.0 * self.transfer_s[wired[:-1], wired[1:]].sum(axis=0)
        dp = float(dp_per_stage.max())
        return CostBreakdown(dp=dp, pp=2.0 * pp_prime, total=dp + 2.0 * pp_prime,
                             dp_per_stage=dp_per_stage, pp_per_replica=chains)

    def evaluate_many(self, assignments: np.ndarray) -> np.ndarray:
        assignments = np.asarray(assignments, dtype=np.int64)
        flat = assignments.reshape(-1, self.stages, self.replicas)
        dp = self.groups_model.stage_dp_seconds(flat).max(axis=-1)
        pp = np.array([self.best_order(a)[0] for a in flat])
        return (dp + 2.0 * pp).reshape(assignments.shape[:-2])
