"""The "ring" model: DP groups all-reduce over a ring (reduce-scatter then all-gather), pipelines as in "yuan".

A ring all-reduce of c_dp bytes over n devices takes 2(n-1) steps; in each step every device sends
one 1/n chunk to its ring successor, all links at once, and the step ends when the slowest ring link
delivers. With step(i, j) = a(i, j) + 8 c_dp / (n b(i, j)) seconds:
  dp_s = 2 (n - 1) x min over ring orders of max over ring links of step(i, j)
(= 2(n-1)/n x 8 c_dp / slowest-link bandwidth + 2(n-1) latencies when the slowest link is also the
longest). The ring order is optimised per stage group: exact bottleneck travelling-salesman by DP
over subsets for n <= 10 devices, beyond that nearest-neighbour tours improved by 2-opt (see
`geotrain.cost.matching`), so for n > 10 dp_s is the cost of the best ring found, an upper bound.
pp_r and total = max_s dp_s / H + max_r pp_r as in "yuan" (c_dp = traffic.dp_bytes[s], each stage its
own; wire bytes and latency rounds as in "yuan"). Not pairwise (no incremental swap search).
"""

from __future__ import annotations

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.base import CostBreakdown
from geotrain.cost.matching import bottleneck_ring, group_ring_bottlenecks
from geotrain.cost.traffic import Traffic, traffic_of_job
from geotrain.cost.yuan import YuanCostModel, pair_transfer_seconds
from geotrain.job import Job


def ring_allreduce_seconds(cluster: Cluster, assignments: np.ndarray, dp_bytes: np.ndarray,
                           nic_bps: np.ndarray | None = None) -> np.ndarray:
    """(..., S) seconds of every stage's ring all-reduce with the ring in the given order (replica r
    sends to r + 1: the order gloo uses, group rank order), `dp_bytes[s]` bytes per member:
    2 (n - 1) x max over ring links of (a + 8 (c / n) / min(b, nic of the sender)).
    `nic_bps` (N,): each device's NIC (None: unlimited); one message per round, so it only caps."""
    assignments = np.asarray(assignments, dtype=np.int64)
    n = assignments.shape[-1]
    if n < 2:
        return np.zeros(assignments.shape[:-1])
    src, dst = assignments, np.roll(assignments, -1, axis=-1)
    rate = cluster.bandwidth_bps[src, dst]
    if nic_bps is not None:
        rate = np.minimum(rate, np.asarray(nic_bps, dtype=float)[src])
    chunk = 8.0 * np.asarray(dp_bytes, dtype=float)[:, None] / n
    step = cluster.latency_s[src, dst] + np.divide(chunk, rate, out=np.zeros(rate.shape), where=rate > 0)
    return 2 * (n - 1) * step.max(axis=-1)


class RingCostModel:
    """Ring all-reduce DP groups (ring order optimised per group) + "yuan" pipelines."""

    name = "ring"

    def __init__(self, cluster: Cluster, traffic: Traffic) -> None:
        self.pipeline = YuanCostModel(cluster, traffic)
        self.stages, self.replicas, self.n_devices = traffic.stages, traffic.replicas, cluster.n_devices
        self.sync_period = traffic.sync_period
        scale = traffic.wire.byte_scale(cluster, "dp", traffic.bytes_per_value)
        distinct = sorted(set(traffic.dp_bytes))
        # one step matrix per distinct stage size (one for a Job's traffic)
        self._steps = [np.ascontiguousarray(pair_transfer_seconds(cluster, b / self.replicas, scale,
                                                                  traffic.wire.dp_latency_rounds)) for b in distinct]
        for step in self._steps:
            step.setflags(write=False)
        self._step_of_stage = [distinct.index(b) for b in traffic.dp_bytes]
        self._empty_stage = np.array([b == 0 for b in traffic.dp_bytes])

    @classmethod
    def for_job(cls, cluster: Cluster, job: Job, stages: int, replicas: int) -> RingCostModel:
        """The model of `job`'s traffic (traffic_of_job) on `stages` x `replicas`."""
        return cls(cluster, traffic_of_job(job, stages, replicas, n_devices=cluster.n_devices))

    def pairwise_terms(self) -> None:
        return None

    def stage_dp_seconds(self, assignments: np.ndarray) -> np.ndarray:
        """(..., S) ring all-reduce seconds of every stage's DP group (per iteration: / sync_period)."""
        assignments = np.asarray(assignments, dtype=np.int64)
        if self.replicas == 1:
            return np.zeros(assignments.shape[:-1])
        if len(self._steps) == 1:
            groups = np.ascontiguousarray(assignments.reshape(-1, self.replicas))
            steps = group_ring_bottlenecks(groups, self._steps[0]).reshape(assignments.shape[:-1])
        else:
            steps = np.stack([group_ring_bottlenecks(np.ascontiguousarray(assignments[..., s, :].reshape(-1, self.replicas)),
                                                     self._steps[k]).reshape(assignments.shape[:-2])
                              for s, k in enumerate(self._step_of_stage)], axis=-1)
        seconds = np.where(self._empty_stage, 0.0, 2 * (self.replicas - 1) * steps)
        return seconds if self.sync_period == 1 else seconds / self.sync_period

    def ring_order(self, group: np.ndarray, stage: int = 0) -> np.ndarray:
        """The device indices of one DP group (of `stage`) in the ring order the model scores."""
        group = np.asarray(group, dtype=np.int64)
        step = self._steps[self._step_of_stage[stage]]
        _, order = bottleneck_ring(np.ascontiguousarray(step[np.ix_(group, group)]))
        return group[order]

    def evaluate(self, assignment: np.ndarray) -> CostBreakdown:
        assignment = np.asarray(assignment, dtype=np.int64)
        dp_per_stage = self.stage_dp_seconds(assignment)
        pp_per_replica = self.pipeline.replica_pp_seconds(assignment)
        dp, pp = float(dp_per_stage.max()), float(pp_per_replica.max())
        return CostBreakdown(dp=dp, pp=pp, total=dp + pp, dp_per_stage=dp_per_stage, pp_per_replica=pp_per_replica)

    def evaluate_many(self, assignments: np.ndarray) -> np.ndarray:
        assignments = np.asarray(assignments, dtype=np.int64)
        return self.stage_dp_seconds(assignments).max(axis=-1) + self.pipeline.replica_pp_seconds(assignments).max(axis=-1)
