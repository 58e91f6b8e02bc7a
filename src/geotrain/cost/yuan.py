"""The default cost model of Yuan et al. (NeurIPS 2022), as in the seed and DESIGN.md.

For devices d, d' with latency a (s) and bandwidth b (bit/s):
  dp_s = max_{d in D_s} sum_{d' in D_s, d' != d} 2 (a(d,d') + 8 c_dp / (R b(d,d')))   (scatter-gather all-reduce)
  pp_r = sum_{s=0}^{S-2} 2 (a(d_s,d_s+1) + 8 c_pp / b(d_s,d_s+1))                      (forward + backward)
  total = max_s dp_s + max_r pp_r

Compression (`link_bytes`, see cost/link_bytes.py): c_dp and c_pp of a pair (d, d') are scaled by
bytes-per-value(link class of d, d') / job.bytes_per_value, and the DP latency term by
`dp_latency_factor`; without it (or with every class unset) the numbers are exactly the above.
"""

from __future__ import annotations

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.base import CostBreakdown, PairwiseTerms
from geotrain.cost.link_bytes import LinkBytes
from geotrain.job import Job, check_layout


def pair_transfer_seconds(cluster: Cluster, nbytes: float, byte_scale: np.ndarray | None = None,
                          latency_factor: float = 1.0) -> np.ndarray:
    """N x N seconds to send `nbytes` once between each device pair: latency + 8 bytes / bandwidth.
    `byte_scale` (N x N) multiplies the bytes per pair, `latency_factor` the latency. Diagonal 0."""
    n = cluster.n_devices
    bandwidth = cluster.bandwidth_bps
    pair_bytes = nbytes if byte_scale is None else nbytes * byte_scale
    latency = cluster.latency_s if latency_factor == 1.0 else latency_factor * cluster.latency_s
    with np.errstate(divide="ignore"):
        seconds = latency + np.where(bandwidth > 0, 8.0 * pair_bytes / np.where(bandwidth > 0, bandwidth, 1.0), 0.0)
    seconds[np.eye(n, dtype=bool)] = 0.0
    return seconds


class YuanCostModel:
    """Vectorised "yuan" model; `evaluate` gathers the pairwise matrices with numpy fancy indexing.
    `link_bytes`: wire bytes per value per link class (compression); None: the job's own."""

    name = "yuan"

    def __init__(self, cluster: Cluster, job: Job, stages: int, replicas: int,
                 link_bytes: LinkBytes | None = None) -> None:
        check_layout(stages, replicas, cluster.n_devices)
        self.cluster = cluster
        self.job = job
        self.stages = stages
        self.replicas = replicas
        self.n_devices = cluster.n_devices
        self.dp_bytes = job.dp_bytes(stages)
        self.pp_bytes = job.pp_bytes(replicas)
        # Each device exchanges 1/R of the stage gradient with every peer, twice (scatter + gather).
        self.link_bytes = link_bytes or LinkBytes()
        value = job.bytes_per_value
        dp_pair = 2.0 * pair_transfer_seconds(cluster, self.dp_bytes / replicas,
                                              self.link_bytes.byte_scale(cluster, "dp", value),
                                              self.link_bytes.dp_latency_factor)
        pp_pair = 2.0 * pair_transfer_seconds(cluster, self.pp_bytes, self.link_bytes.byte_scale(cluster, "pp", value))
        dp_pair.setflags(write=False)
        pp_pair.setflags(write=False)
        self._terms = PairwiseTerms(dp_pair_s=dp_pair, pp_pair_s=pp_pair)

    def pairwise_terms(self) -> PairwiseTerms:
        return self._terms

    def stage_dp_seconds(self, assignments: np.ndarray) -> np.ndarray:
        """(..., S) all-reduce seconds of every stage's DP group."""
        groups = assignments[..., :, :, None], assignments[..., :, None, :]
        return self._terms.dp_pair_s[groups].sum(axis=-1).max(axis=-1)

    def cut_pp_seconds(self, assignments: np.ndarray) -> np.ndarray:
        """(..., S-1, R) seconds of every stage cut of every replica (activations + their gradients)."""
        return self._terms.pp_pair_s[assignments[..., :-1, :], assignments[..., 1:, :]]

    def replica_pp_seconds(self, assignments: np.ndarray) -> np.ndarray:
        """(..., R) pipeline seconds of every replica (cuts in series)."""
        return self.cut_pp_seconds(assignments).sum(axis=-2)

    def evaluate(self, assignment: np.ndarray) -> CostBreakdown:
        assignment = np.asarray(assignment, dtype=np.int64)
        dp_per_stage = self.stage_dp_seconds(assignment)
        pp_per_replica = self.replica_pp_seconds(assignment)
        dp, pp = float(dp_per_stage.max()), float(pp_per_replica.max())
        return CostBreakdown(dp=dp, pp=pp, total=dp + pp, dp_per_stage=dp_per_stage, pp_per_replica=pp_per_replica)

    def evaluate_many(self, assignments: np.ndarray) -> np.ndarray:
        assignments = np.asarray(assignments, dtype=np.int64)
        return self.stage_dp_seconds(assignments).max(axis=-1) + self.replica_pp_seconds(assignments).max(axis=-1)
