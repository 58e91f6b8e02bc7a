"""The "yuan+compute" model: the "yuan" communication terms plus per-device compute, so that a mix
of GPU types (V100 + A100 + T4 ...) changes which plan is best.

Formula (seconds per iteration; no overlap of compute and communication, as the seed's comparison):
  t(d)      = 6 x params x seq x global_batch / (S x R)  /  (peak_flops(gpu of d) x utilisation)
              the compute of one (stage, replica) slot: 1/S of the layers on 1/R of the batch.
  compute_r = (1/m) sum_s t(d_s,r) + ((m-1)/m) max_s t(d_s,r)
              GPipe with m equal micro-batches: the first micro-batch flows through every stage,
              the other m-1 are paced by the slowest stage (the makespan of a flow shop with
              identical jobs; forward and backward both scale with t, so the sum keeps the form).
              m = max(1, global_batch // R): one sequence per micro-batch.
  total     = dp + max_r (pp_r + compute_r)
              a replica finishes its compute and its pipeline transfers before the DP all-reduce.
Reported: dp, pp = max_r pp_r, extra "compute" = max_r compute_r (so total <= dp + pp + compute,
with equality when all GPUs are alike). Homogeneous seed job on 32 V100s: t = 10.2 s (the seed's
figure) and compute = (1 + 3/128) x 10.2 = 10.44 s (S = 4, m = 128: the pipeline bubble).
Uneven split (`layer_shares`, cost/layer_split.py): stage s holds a fraction f_s of the layers
instead of 1/S, so t(d_s,r) = 6 x params x seq x global_batch x f_s / R / (peak x utilisation) and
stage s's gradient is f_s x the model's gradient bytes (sum of traffic.dp_bytes; dp_s by the same scatter-gather formula with that size).
"speed" gives every assignment the speed-optimal integer split of the job's layers (faster stages
take more); None (default) or equal fractions give the numbers above.
Sharded replicas (`sharding`, cost/shards.py: the cluster is a slot cluster, each device a slot of K devices):
t(d) = the slot's compute / K + its FSDP all-gathers and reduce-scatter inside the slot (Sharding.fsdp_seconds).
Not pairwise: searches that need pairwise terms refuse it; `genetic` and `random` work.
"""

from __future__ import annotations

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.base import CostBreakdown
from geotrain.cost.gpus import DEFAULT_UTILISATION
from geotrain.cost.layer_split import StageShares, device_peak_flops
from geotrain.cost.schedule import stage_allreduce_seconds
from geotrain.cost.shards import NO_SHARDING, Sharding, largest_stage_param_bytes
from geotrain.cost.traffic import Traffic, traffic_of_job
from geotrain.cost.yuan import YuanCostModel
from geotrain.job import Job


class YuanComputeCostModel:
    """"yuan" communication + heterogeneous per-device compute (see the module docstring)."""

    name = "yuan+compute"

    def __init__(self, cluster: Cluster, traffic: Traffic, slot_seconds: np.ndarray, micro_batches: int,
                 shares: StageShares | None = None) -> None:
        """`slot_seconds` (N,): each device's compute seconds of one (equal 1/S) slot per iteration;
        `micro_batches` m per replica; `shares`: an uneven layer split (None: 1/S each)."""
        self.comm = YuanCostModel(cluster, traffic)
        self.cluster = cluster
        self.stages, self.replicas, self.n_devices = traffic.stages, traffic.replicas, cluster.n_devices
        self.sync_period = traffic.sync_period
        self.micro_batches = micro_batches
        self.slot_seconds = np.array(slot_seconds, dtype=float)
        self.slot_seconds.setflags(write=False)
        self.shares = shares
        self.model_grad_bytes = float(sum(traffic.dp_bytes))

    @classmethod
    def for_job(cls, cluster: Cluster, job: Job, stages: int, replicas: int, utilisation: float = DEFAULT_UTILISATION,
                micro_batches: int | None = None, layer_shares: object = None,
                sync_period: int = 1, sharding: Sharding = NO_SHARDING) -> YuanComputeCostModel:
        """`job`'s traffic and FLOPs at `utilisation` of each GPU's peak; `layer_shares`: None / "equal"
        (1/S), "speed" (per assignment) or S fractions summing to 1; `sync_period` H: the DP exchange every H
        steps (local SGD / DiLoCo: its seconds per iteration / H); `sharding`: `cluster` is a slot cluster of
        sharding.k devices per slot (cost/shards.py)."""
        traffic = traffic_of_job(job, stages, replicas, n_devices=cluster.n_devices, sync_period=sync_period)
        peak = device_peak_flops(cluster)
        slot_flops = job.flops_per_iteration() / (stages * replicas * sharding.k)
        fsdp = sharding.fsdp_seconds(cluster, largest_stage_param_bytes(job, stages))
        return cls(cluster, traffic, slot_flops / (peak * utilisation) + fsdp,
                   micro_batches or max(1, job.global_batch // replicas),
                   StageShares.build(layer_shares, stages, job.layers, peak))

    def pairwise_terms(self) -> None:
        return None

    def stage_shares(self, assignments: np.ndarray) -> np.ndarray | None:
        """(..., S) fraction of the layers on each stage, or None (1/S each: the plain model)."""
        return None if self.shares is None else self.shares.of(assignments)

    def replica_compute_seconds(self, assignments: np.ndarray, shares: np.ndarray | None = None) -> np.ndarray:
        """(..., R) GPipe compute seconds of every replica (`shares`: stage_shares of the assignments,
        computed here when not given)."""
        times = self.slot_seconds[assignments]
        shares = self.stage_shares(assignments) if shares is None else shares
        if shares is not None:
            times = times * (self.stages * shares)[..., :, None]
        m = self.micro_batches
        return times.sum(axis=-2) / m + times.max(axis=-2) * (m - 1) / m

    def stage_dp_seconds(self, assignments: np.ndarray, shares: np.ndarray | None = None) -> np.ndarray:
        """(..., S) all-reduce seconds of every stage's DP group ("yuan"'s dp_s; with layer `shares`, of
        each stage's own gradient size; `shares` computed here when not given)."""
        shares = self.stage_shares(assignments) if shares is None else shares
        if shares is None:
            return self.comm.stage_dp_seconds(assignments)
        seconds = stage_allreduce_seconds(self.cluster, assignments, self.model_grad_bytes * shares)
        return seconds if self.sync_period == 1 else seconds / self.sync_period

    def evaluate(self, assignment: np.ndarray) -> CostBreakdown:
        assignment = np.asarray(assignment, dtype=np.int64)
        shares = self.stage_shares(assignment)
        dp_per_stage = self.stage_dp_seconds(assignment, shares)
        pp_per_replica = self.comm.replica_pp_seconds(assignment)
        compute = self.replica_compute_seconds(assignment, shares)
        dp = float(dp_per_stage.max())
        return CostBreakdown(dp=dp, pp=float(pp_per_replica.max()), total=dp + float((pp_per_replica + compute).max()),
                             dp_per_stage=dp_per_stage, pp_per_replica=pp_per_replica,
                             extra={"compute": float(compute.max())})

    def evaluate_many(self, assignments: np.ndarray) -> np.ndarray:
        assignments = np.asarray(assignments, dtype=np.int64)
        shares = self.stage_shares(assignments)
        replica = self.comm.replica_pp_seconds(assignments) + self.replica_compute_seconds(assignments, shares)
        return self.stage_dp_seconds(assignments, shares).max(axis=-1) + replica.max(axis=-1)
