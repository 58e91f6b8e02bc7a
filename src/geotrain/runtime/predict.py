"""The cost model's prediction for a running job, with the bytes the job really sends.

A registered cost model ("yuan" by default; "ring" scores the ring all-reduce that gloo runs) is evaluated with c_dp = the gradient payload bytes of
each stage (stages differ: stage 0 holds the embedding, the last the head) and c_pp = the activation
payload bytes one replica sends across one cut per iteration (all micro-batches), then multiplied
by the time scale, so that prediction and the emulated, measured run are in the same seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.registry import DEFAULT_COST_MODEL, build_cost_model
from geotrain.job import Job


@dataclass(frozen=True)
class CommPrediction:
    """Predicted communication seconds per iteration (already time-scaled)."""

    dp_s: float
    pp_s: float
    dp_per_stage_s: tuple[float, ...]
    pp_per_replica_s: tuple[float, ...]

    @property
    def total_s(self) -> float:
        return self.dp_s + self.pp_s

    def to_json(self) -> dict[str, float | list[float]]:
        return {"dp": self.dp_s, "pp": self.pp_s, "total": self.total_s,
                "dp_per_stage": list(self.dp_per_stage_s), "pp_per_replica": list(self.pp_per_replica_s)}


def real_bytes_job(dp_bytes: float, pp_bytes: int, stages: int, replicas: int) -> Job:
    """A Job whose dp_bytes(stages) == dp_bytes and pp_bytes(replicas) == pp_bytes exactly
    (1 byte per value, seq_len = hidden = 1, global batch = pp_bytes x replicas)."""
    return Job(name="runtime-real-bytes", params=float(dp_bytes) * stages, seq_len=1, hidden=1,
               global_batch=max(1, int(pp_bytes)) * replicas, layers=stages, bytes_per_value=1)


def predict_comm(cluster: Cluster, assignment: np.ndarray, dp_bytes_per_stage: Sequence[float],
                 pp_bytes_per_cut: int, time_scale: float, cost_model: str = DEFAULT_COST_MODEL) -> CommPrediction:
    """The cost model's dp and pp seconds for this assignment and these real payload sizes, x time_scale."""
    assignment = np.asarray(assignment, dtype=np.int64)
    stages, replicas = assignment.shape
    if len(dp_bytes_per_stage) != stages:
        raise ValueError(f"need one dp byte count per stage ({stages}), got {len(dp_bytes_per_stage)}")
    dp_per_stage = []
    pp_per_replica: np.ndarray | None = None
    for stage, dp_bytes in enumerate(dp_bytes_per_stage):
        job = real_bytes_job(dp_bytes, pp_bytes_per_cut, stages, replicas)
        model = build_cost_model(cost_model, cluster, job, stages, replicas)
        breakdown = model.evaluate(assignment)
        dp_per_stage.append(float(breakdown.dp_per_stage[stage]) * time_scale)
        if pp_per_replica is None:
            pp_per_replica = breakdown.pp_per_replica * time_scale
    assert pp_per_replica is not None
    if pp_bytes_per_cut <= 0:
        pp_per_replica = np.zeros(replicas)
    return CommPrediction(dp_s=max(dp_per_stage), pp_s=float(pp_per_replica.max()),
                          dp_per_stage_s=tuple(dp_per_stage), pp_per_replica_s=tuple(float(x) for x in pp_per_replica))


ITERATION_MODELS = ("schedule", "ring", "yuan")
"""Models that predict a whole iteration from measured compute; the first is the best (docs/runtime.md)."""


def predict_iteration_s(cluster: Cluster, assignment: np.ndarray, slot_compute_s: np.ndarray,
                        dp_bytes_per_stage: Sequence[float], pp_bytes_per_cut: int, microbatches: int,
                        schedule: str, time_scale: float, cost_model: str = ITERATION_MODELS[0]) -> float:
    """Seconds of one iteration (wall: compute at real speed, link time x time_scale).

    `slot_compute_s[s, r]`: the measured compute seconds of slot (s, r) in the iteration (the runtime's
    record: forward, backward, codecs, optimizer). "schedule": the event simulation of cost/schedule.py
    with that compute split into M forwards and M backwards (1 : 2), M messages of pp_bytes / M per cut
    and direction, and the ring all-reduce in replica order (gloo's); "yuan" / "ring": the no-overlap
    view, that model's dp + pp plus the slowest slot's compute."""
    from geotrain.cost.schedule import schedule_seconds, simulate_pipeline

    assignment = np.asarray(assignment, dtype=np.int64)
    slot_compute_s = np.asarray(slot_compute_s, dtype=float)
    if cost_model in ("yuan", "ring"):
        comm = predict_comm(cluster, assignment, dp_bytes_per_stage, pp_bytes_per_cut, time_scale, cost_model)
        return comm.total_s + float(slot_compute_s.max())
    if cost_model != "schedule":
        raise ValueError(f"--cost-model: one of {', '.join(ITERATION_MODELS)}, got {cost_model!r}")
    forward_s = np.zeros(cluster.n_devices)
    forward_s[assignment] = slot_compute_s / (3.0 * microbatches)
    if time_scale <= 0:  # plain gloo: only compute is modelled
        no_link = np.zeros((assignment.shape[1], assignment.shape[0] - 1))
        return float(simulate_pipeline(forward_s[assignment.T], no_link, no_link, microbatches, schedule).max())
    # The simulation is homogeneous in time: with compute / F as input, F x its result is
    # compute at real speed plus link time x F.
    ready, dp = schedule_seconds(cluster, assignment, forward_s / time_scale, pp_bytes_per_cut / microbatches,
                                 np.asarray(dp_bytes_per_stage, dtype=float), microbatches, schedule, allreduce="ring")
    return float((ready + dp).max()) * time_scale
