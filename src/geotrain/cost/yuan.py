"""The default cost model of Yuan et al. (NeurIPS 2022), as in the seed.

For devices d, d' with latency a (s) and bandwidth b (bit/s), c_dp = traffic.dp_bytes[s] (gradient
of stage s) and c_pp = traffic.pp_bytes[c] (activations of one replica across cut c per iteration):
  dp_s = max_{d in D_s} sum_{d' in D_s, d' != d} 2 (a(d,d') + 8 c_dp / (R b(d,d')))   (scatter-gather all-reduce)
  pp_r = sum over cuts c of 2 (a(d_c,d_c+1) + 8 c_pp / b(d_c,d_c+1))                    (forward + backward)
  total = max_s dp_s / H + max_r pp_r                                                    (H: traffic.sync_period)
A cut of 0 bytes costs nothing (no message). Looped pipelines (V > 1 stages per device) have
S V - 1 cuts, cut c from the device of stage c mod S to that of (c + 1) mod S (cost/traffic.py).

Compression (`traffic.wire`): c_dp and c_pp of a pair (d, d') are scaled by bytes-per-value(link
class of d, d') / traffic.bytes_per_value, and the DP latency term by `dp_latency_rounds`; unset,
the numbers are exactly the above.
"""

from __future__ import annotations

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.base import CostBreakdown, PairwiseTerms
from geotrain.cost.traffic import Traffic, traffic_of_job
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


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


class YuanCostModel:
    """Vectorised "yuan" model; `evaluate` gathers the pairwise matrices with numpy fancy indexing.
    With uniform traffic (every stage and every cut alike, one pipeline per device) it is pairwise;
    otherwise it keeps one matrix per stage and per cut."""

    name = "yuan"

    def __init__(self, cluster: Cluster, traffic: Traffic) -> None:
        check_layout(traffic.stages, traffic.replicas, cluster.n_devices)
        self.cluster = cluster
        self.traffic = traffic
        self.stages, self.replicas = traffic.stages, traffic.replicas
        self.n_devices = cluster.n_devices
        native, wire = traffic.bytes_per_value, traffic.wire
        dp_scale, pp_scale = wire.byte_scale(cluster, "dp", native), wire.byte_scale(cluster, "pp", native)

        def dp_pair(nbytes: float) -> np.ndarray:
            # Each device exchanges 1/R of the stage gradient with every peer, twice (scatter + gather).
            seconds = 2.0 * pair_transfer_seconds(cluster, nbytes / self.replicas, dp_scale, wire.dp_latency_rounds)
            seconds = seconds if nbytes > 0 else np.zeros_like(seconds)
            return seconds if traffic.sync_period == 1 else seconds / traffic.sync_period

        def pp_pair(nbytes: float) -> np.ndarray:
            return 2.0 * pair_transfer_seconds(cluster, nbytes, pp_scale) if nbytes > 0 else np.zeros((self.n_devices,) * 2)

        self._uniform_dp, self._uniform_pp = traffic.uniform_dp(), traffic.uniform_pp()
        self._dp_pair = _frozen(dp_pair(traffic.dp_bytes[0]) if self._uniform_dp else
                                np.stack([dp_pair(b) for b in traffic.dp_bytes]))
        if self._uniform_pp:
            self._pp_pair = _frozen(pp_pair(traffic.pp_bytes[0]) if traffic.pp_bytes else pp_pair(0.0))
        else:
            self._pp_pair = _frozen(np.stack([pp_pair(b) for b in traffic.pp_bytes]))
        self._cut_src, self._cut_dst = traffic.cut_devices()
        self._terms = PairwiseTerms(dp_pair_s=self._dp_pair, pp_pair_s=self._pp_pair) \
            if self._uniform_dp and self._uniform_pp else None

    @classmethod
    def for_job(cls, cluster: Cluster, job: Job, stages: int, replicas: int, sync_period: int = 1) -> YuanCostModel:
        """The model of `job`'s traffic (traffic_of_job) on `stages` x `replicas`; `sync_period` H: the DP
        exchange runs every H steps (its seconds per iteration / H)."""
        return cls(cluster, traffic_of_job(job, stages, replicas, n_devices=cluster.n_devices, sync_period=sync_period))

    def pairwise_terms(self) -> PairwiseTerms | None:
        return self._terms

    def stage_dp_seconds(self, assignments: np.ndarray) -> np.ndarray:
        """(..., S) all-reduce seconds of every stage's DP group (per iteration: / sync_period)."""
        a, b = assignments[..., :, :, None], assignments[..., :, None, :]
        if self._uniform_dp:
            return self._dp_pair[a, b].sum(axis=-1).max(axis=-1)
        stage = np.arange(self.stages)[:, None, None]
        return self._dp_pair[stage, a, b].sum(axis=-1).max(axis=-1)

    def cut_pp_seconds(self, assignments: np.ndarray) -> np.ndarray:
        """(..., C, R) seconds of every cut of every replica (activations + their gradients)."""
        if self._uniform_pp:
            return self._pp_pair[assignments[..., :-1, :], assignments[..., 1:, :]]
        cut = np.arange(len(self._cut_src))[:, None]
        return self._pp_pair[cut, assignments[..., self._cut_src, :], assignments[..., self._cut_dst, :]]

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
