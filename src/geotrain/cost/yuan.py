"""The default cost model of Yuan et al. (NeurIPS 2022), as in the seed and DESIGN.md.

For devices d, d' with latency a (s) and bandwidth b (bit/s):
  dp_s = max_{d in D_s} sum_{d' in D_s, d' != d} 2 (a(d,d') + 8 c_dp / (R b(d,d')))   (scatter-gather all-reduce)
  pp_r = sum_{s=0}^{S-2} 2 (a(d_s,d_s+1) + 8 c_pp / b(d_s,d_s+1))                      (forward + backward)
  total = max_s dp_s + max_r pp_r
"""

from __future__ import annotations

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.base import CostBreakdown, PairwiseTerms
from geotrain.job import Job, check_layout


def pair_transfer_seconds(cluster: Cluster, nbytes: float) -> np.ndarray:
    """N x N seconds to send `nbytes` once between each device pair: latency + 8 bytes / bandwidth.
    Diagonal 0."""
    n = cluster.n_devices
    bandwidth = cluster.bandwidth_bps
    with np.errstate(divide="ignore"):
        seconds = cluster.latency_s + np.where(bandwidth > 0, 8.0 * nbytes / np.where(bandwidth > 0, bandwidth, 1.0), 0.0)
    seconds[np.eye(n, dtype=bool)] = 0.0
    return seconds


class YuanCostModel:
    """Vectorised "yuan" model; `evaluate` gathers the pairwise matrices with numpy fancy indexing."""

    name = "yuan"

    def __init__(self, cluster: Cluster, job: Job, stages: int, replicas: int) -> None:
        check_layout(stages, replicas, cluster.n_devices)
        self.cluster = cluster
        self.job = job
        self.stages = stages
        self.replicas = replicas
        self.n_devices = cluster.n_devices
        self.dp_bytes = job.dp_bytes(stages)
        self.pp_bytes = job.pp_bytes(replicas)
        # Each device exchanges 1/R of the stage gradient with every peer, twice (scatter + gather).
        dp_pair = 2.0 * pair_transfer_seconds(cluster, self.dp_bytes / replicas)
        pp_pair = 2.0 * pair_transfer_seconds(cluster, self.pp_bytes)
        dp_pair.setflags(write=False)
        pp_pair.setflags(write=False)
        self._terms = PairwiseTerms(dp_pair_s=dp_pair, pp_pair_s=pp_pair)

    def pairwise_terms(self) -> PairwiseTerms:
        return self._terms

    def stage_dp_seconds(self, assignments: np.ndarray) -> np.ndarray:
        """(..., S) all-reduce seconds of every stage's DP group."""
        groups = assignments[..., :, :, None], assignments[..., :, None, :]
        return self._terms.dp_pair_s[groups].sum(axis=-1).max(axis=-1)

    def replica_pp_seconds(self, assignments: np.ndarray) -> np.ndarray:
        """(..., R) pipeline seconds of every replica (cuts in series)."""
        return self._terms.pp_pair_s[assignments[..., :-1, :], assignments[..., 1:, :]].sum(axis=-2)

    def evaluate(self, assignment: np.ndarray) -> CostBreakdown:
        assignment = np.asarray(assignment, dtype=np.int64)
        dp_per_stage = self.stage_dp_seconds(assignment)
        pp_per_replica = self.replica_pp_seconds(assignment)
        dp, pp = float(dp_per_stage.max()), float(pp_per_replica.max())
        return CostBreakdown(dp=dp, pp=pp, total=dp + pp, dp_per_stage=dp_per_stage, pp_per_replica=pp_per_replica)

    def evaluate_many(self, assignments: np.ndarray) -> np.ndarray:
        assignments = np.asarray(assignments, dtype=np.int64)
        return self.stage_dp_seconds(assignments).max(axis=-1) + self.replica_pp_seconds(assignments).max(axis=-1)
