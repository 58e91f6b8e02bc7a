"""The cost model's prediction for a running job, with the bytes the job really sends.

The measured bytes become a Traffic (`measured_traffic`): dp_bytes = the gradient payload bytes of
each stage (stages differ: stage 0 holds the embedding, the last the head), pp_bytes = the activation
payload bytes one replica sends across each cut per iteration (all micro-batches; with V virtual
stages per rank, S V - 1 cuts of 1/V of what rank 0 sends). One cost model is built from it ("yuan"
by default; "ring" scores the ring all-reduce that gloo runs; "schedule" simulates the schedule the
run uses, looped ones included) and its seconds are multiplied by the time scale, so that
prediction and the emulated, measured run are in the same seconds.

A run that does not exchange every step (local SGD / DiLoCo, `--sync-every H`, with P fragments) is
charged its DP exchange `syncs_per_step` = P / H times per step (`sync_rate`): the mean over steps of
an exchange of the measured (largest) payload every H / P steps; pipeline traffic is charged every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.actions import schedule_actions
from geotrain.cost.registry import DEFAULT_COST_MODEL, build_traffic_model
from geotrain.cost.schedule import ScheduleCostModel, simulate_actions
from geotrain.cost.traffic import Traffic


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


def measured_traffic(dp_bytes_per_stage: Sequence[float], pp_bytes_per_cut: int, replicas: int,
                     virtual_stages: int = 1) -> Traffic:
    """The Traffic of a run: `dp_bytes_per_stage` (S,) payload bytes, `pp_bytes_per_cut` the activation
    bytes rank 0 of a replica sends per iteration (all its `virtual_stages` stages: each cut carries
    1/V of it; 0: no pipeline traffic)."""
    stages = len(dp_bytes_per_stage)
    cuts = stages * virtual_stages - 1
    return Traffic(dp_bytes=tuple(float(b) for b in dp_bytes_per_stage),
                   pp_bytes=(max(0.0, float(pp_bytes_per_cut)) / virtual_stages,) * cuts, replicas=replicas)


def sync_rate(sync_every: int | None, fragments: int = 1) -> float:
    """DP exchanges per step: 1 every step (sync_every None), else fragments / sync_every."""
    return 1.0 if sync_every is None else min(1.0, fragments / sync_every)


def predict_comm(cluster: Cluster, assignment: np.ndarray, dp_bytes_per_stage: Sequence[float],
                 pp_bytes_per_cut: int, time_scale: float, cost_model: str = DEFAULT_COST_MODEL,
                 virtual_stages: int = 1, syncs_per_step: float = 1.0) -> CommPrediction:
    """The cost model's dp and pp seconds for this assignment and these real payload sizes, x time_scale;
    dp charged `syncs_per_step` times per step (sync_rate)."""
    assignment = np.asarray(assignment, dtype=np.int64)
    stages, replicas = assignment.shape
    if len(dp_bytes_per_stage) != stages:
        raise ValueError(f"need one dp byte count per stage ({stages}), got {len(dp_bytes_per_stage)}")
    traffic = measured_traffic(dp_bytes_per_stage, pp_bytes_per_cut, replicas, virtual_stages)
    breakdown = build_traffic_model(cost_model, cluster, traffic).evaluate(assignment)
    dp_per_stage = breakdown.dp_per_stage * time_scale * syncs_per_step
    pp_per_replica = breakdown.pp_per_replica * time_scale
    return CommPrediction(dp_s=float(dp_per_stage.max()), pp_s=float(pp_per_replica.max()),
                          dp_per_stage_s=tuple(float(x) for x in dp_per_stage),
                          pp_per_replica_s=tuple(float(x) for x in pp_per_replica))


ITERATION_MODELS = ("schedule", "ring", "yuan")
"""Models that predict a whole iteration from measured compute; the first is the best (docs/history/runtime.md)."""


def predict_iteration_s(cluster: Cluster, assignment: np.ndarray, slot_compute_s: np.ndarray,
                        dp_bytes_per_stage: Sequence[float], pp_bytes_per_cut: int, microbatches: int,
                        schedule: str, time_scale: float, cost_model: str = ITERATION_MODELS[0],
                        virtual_stages: int = 1, syncs_per_step: float = 1.0,
                        slot_after_s: np.ndarray | None = None) -> float:
    """Seconds of one iteration (wall: compute at real speed, link time x time_scale).

    `slot_compute_s[s, r]`: the measured seconds slot (s, r) works inside the pipeline schedule in the
    iteration (forward and backward chunks, and the host work between them); `slot_after_s[s, r]` (None:
    0): what it works after the schedule (the gradient sync's compute: codecs, clipping, optimizer; the
    step's other host work). "schedule": the event simulation of cost/schedule.py of `schedule`'s actions
    with the compute split into M forwards and M backwards (1 : 2) per virtual stage, M messages of
    pp_bytes / (V M) per cut and direction, the ring all-reduce in replica order (gloo's), and the
    after-seconds after each stage's all-reduce, in series (ScheduleCostModel's `after_s`); "yuan" /
    "ring": the no-overlap view, that model's dp + pp plus the slowest slot's compute and after-seconds.
    `syncs_per_step` < 1 (sync_rate): the DP exchange's share of the iteration (with it less without it)
    is charged that often."""
    assignment = np.asarray(assignment, dtype=np.int64)
    slot_compute_s = np.asarray(slot_compute_s, dtype=float)
    slot_after_s = np.zeros(slot_compute_s.shape) if slot_after_s is None else np.asarray(slot_after_s, dtype=float)
    if cost_model in ("yuan", "ring"):
        comm = predict_comm(cluster, assignment, dp_bytes_per_stage, pp_bytes_per_cut, time_scale, cost_model,
                            virtual_stages, syncs_per_step)
        return comm.total_s + float((slot_compute_s + slot_after_s).max())
    if cost_model != "schedule":
        raise ValueError(f"--cost-model: one of {', '.join(ITERATION_MODELS)}, got {cost_model!r}")
    forward_s, after_s = np.zeros(cluster.n_devices), np.zeros(cluster.n_devices)
    forward_s[assignment] = slot_compute_s / (3.0 * microbatches)
    after_s[assignment] = slot_after_s
    if time_scale <= 0:  # plain gloo: only compute is modelled
        actions = schedule_actions(schedule, assignment.shape[0], microbatches, virtual_stages)
        forward = np.tile(forward_s[assignment.T] / virtual_stages, virtual_stages)  # stage v on device v mod S
        no_link = np.zeros(forward.shape[:-1] + (forward.shape[-1] - 1,))
        last_backward = simulate_actions(actions, forward, no_link, no_link)[0]  # (R, S)
        return float((last_backward.max(axis=0) + slot_after_s.max(axis=1)).max())

    def simulated_s(dp_bytes: Sequence[float]) -> float:
        traffic = measured_traffic(dp_bytes, pp_bytes_per_cut, assignment.shape[1], virtual_stages)
        # The simulation is homogeneous in time: with compute / F as input, F x its result is
        # compute at real speed plus link time x F.
        model = ScheduleCostModel(cluster, traffic, forward_s / time_scale, microbatches, schedule=schedule,
                                  allreduce="ring", after_s=after_s / time_scale)
        return model.evaluate(assignment).total * time_scale

    with_sync = simulated_s(dp_bytes_per_stage)
    if syncs_per_step >= 1.0:
        return with_sync
    without = simulated_s([0.0] * len(dp_bytes_per_stage))
    return without + syncs_per_step * (with_sync - without)
