"""The "schedule" model: iteration seconds from an exact event simulation of the pipeline schedule.

What it adds over "yuan" (communication only, each replica's cuts in series, whole-iteration bytes)
and "yuan+compute" (a closed-form GPipe bubble, no overlap): per-micro-batch compute and transfers,
latency paid per message but pipelined, FIFO link queues, the schedule's real op order, and the
DP all-reduce of each stage overlapped with the other stages' remaining work.

Per replica r with devices d_0 .. d_{S-1}, M micro-batches of b = global_batch / (R M) sequences:
- compute: forward f_s = 2 x params/S x seq x b FLOPs, backward 2 f_s (the 6 x params x tokens rule
  split 1:2), at peak_flops(gpu of d_s) x utilisation. One op at a time per device, in the order of
  `pipeline_order` (GPipe: all forwards, then all backwards in micro-batch order, as
  torch.distributed.pipelining's ScheduleGPipe runs them; 1F1B: min(S-1-s, M) warm-up
  forwards, then F/B alternately, then the remaining backwards).
- transfers: after F of micro-batch m at stage s, its activations (pp_bytes / M bytes) go d_s ->
  d_{s+1}; after B at stage s > 0, the input gradient (same size) goes d_s -> d_{s-1}. Each directed
  link is a FIFO queue: start = max(handed over, link free), busy 8 bytes / bandwidth, arrives
  `latency` after it ends (the runtime's link emulation, runtime/links.py, does the same).
- F at s starts when the device is free and the activation has arrived; B at s < S-1 when the
  gradient from s+1 has arrived; B at S-1 follows its own F in the device order.
- DP: stage s's all-reduce starts when every replica has finished its last backward at stage s and
  its last message has left the device (a stage waits for its sends before the all-reduce), and
  takes "yuan"'s dp_s (scatter-gather formula) or, with allreduce="ring", the ring all-reduce in
  replica order (gloo's; cost/ring.ring_allreduce_seconds); it overlaps whatever other stages still do.
  iteration = max_s (max_r ready at s + dp_s).
- NIC (optional, `nic_bps` per device): caps every message's rate; a stage's messages to both
  neighbours also queue FIFO on its NIC, each busy 8 bytes / nic.
- uneven split (`layer_shares`, cost/layer_split.py): stage s holds a fraction f_s of the layers, so
  its forward is f_s x S times the 1/S figure above and its gradient f_s x params x bytes; "speed"
  gives every assignment the speed-optimal integer split of the job's layers.
Simplifications: all-reduce traffic does not share links with activations; compute does not slow
down communication; without layer shares every stage holds 1/S of the parameters. Vectorised over
replicas (and over a batch of assignments); the loop runs over the 2 S M ops once.
"""

from __future__ import annotations

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.base import CostBreakdown
from geotrain.cost.gpus import DEFAULT_UTILISATION, gpu_peak_flops
from geotrain.cost.layer_split import StageShares, device_peak_flops
from geotrain.cost.memory import MODELLED_SCHEDULES
from geotrain.cost.yuan import YuanCostModel
from geotrain.errors import GeotrainError
from geotrain.job import Job


class ScheduleError(GeotrainError, ValueError):
    """An unknown pipeline schedule or an invalid micro-batch count."""


def pipeline_order(kind: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The ("F" | "B", micro-batch) ops of `stage` in execution order (see the module docstring)."""
    if kind == "gpipe":
        return [("F", m) for m in range(microbatches)] + [("B", m) for m in range(microbatches)]
    if kind == "1f1b":
        warmup = min(stages - 1 - stage, microbatches)
        order = [("F", m) for m in range(warmup)]
        for i in range(microbatches - warmup):
            order += [("F", warmup + i), ("B", i)]
        return order + [("B", m) for m in range(microbatches - warmup, microbatches)]
    raise ScheduleError(f"unknown pipeline schedule {kind!r} (known: {', '.join(MODELLED_SCHEDULES)})")


def simulate_pipeline(forward_s: np.ndarray, send_busy_s: np.ndarray, send_latency_s: np.ndarray,
                      microbatches: int, kind: str) -> np.ndarray:
    """End time (seconds) of the last backward of every stage, shape (..., S), for pipelines whose
    stage s needs forward_s[..., s] per micro-batch forward (backward: twice that), and whose cut s
    (stage s <-> s+1, both directions alike) is busy send_busy_s[..., s] per message and adds
    send_latency_s[..., s]. Leading axes (replicas, assignments) are simulated together."""
    return simulate_pipeline_sends(forward_s, send_busy_s, send_latency_s, microbatches, kind)[0]


def simulate_pipeline_sends(forward_s: np.ndarray, send_busy_s: np.ndarray, send_latency_s: np.ndarray,
                            microbatches: int, kind: str, nic_busy_s: np.ndarray | None = None,
                            ) -> tuple[np.ndarray, np.ndarray]:
    """`simulate_pipeline`, plus (..., S) the time each stage's last message has left its device
    (serialised: a stage waits for its sends before its all-reduce). `nic_busy_s[..., s]`: seconds
    one message occupies stage s's NIC (None: unlimited NIC); a stage's sends to its two neighbours
    then also queue FIFO on its NIC, not only on their own links."""
    S = forward_s.shape[-1]
    shape = forward_s.shape[:-1]
    orders = [pipeline_order(kind, s, S, microbatches) for s in range(S)]
    position = [0] * S
    device_free = np.zeros(shape + (S,))
    fwd_link_free = np.zeros(shape + (max(S - 1, 0),))
    bwd_link_free = np.zeros(shape + (max(S - 1, 0),))
    act_arrival: dict[tuple[int, int], np.ndarray] = {}   # (stage receiving, m) -> time
    grad_arrival: dict[tuple[int, int], np.ndarray] = {}
    last_backward = np.zeros(shape + (S,))
    nic_free = np.zeros(shape + (S,))
    sends_done = np.zeros(shape + (S,))

    def post(link_free: np.ndarray, cut: int, sender: int, handed: np.ndarray) -> np.ndarray:
        """FIFO on the directed link (and the sender's NIC): the message's arrival."""
        start = np.maximum(handed, link_free[..., cut])
        if nic_busy_s is not None:
            start = np.maximum(start, nic_free[..., sender])
            nic_free[..., sender] = start + nic_busy_s[..., sender]
        link_free[..., cut] = start + send_busy_s[..., cut]
        sends_done[..., sender] = np.maximum(sends_done[..., sender], link_free[..., cut])
        return link_free[..., cut] + send_latency_s[..., cut]

    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for s in range(S):
            while position[s] < len(orders[s]):
                op, m = orders[s][position[s]]
                if op == "F":
                    ready = act_arrival.pop((s, m), None) if s > 0 else 0.0
                    if ready is None:
                        break
                    end = np.maximum(device_free[..., s], ready) + forward_s[..., s]
                    if s < S - 1:
                        act_arrival[(s + 1, m)] = post(fwd_link_free, s, s, end)
                else:
                    ready = grad_arrival.pop((s, m), None) if s < S - 1 else 0.0
                    if ready is None:
                        break
                    end = np.maximum(device_free[..., s], ready) + 2.0 * forward_s[..., s]
                    last_backward[..., s] = end
                    if s > 0:
                        grad_arrival[(s - 1, m)] = post(bwd_link_free, s - 1, s, end)
                device_free[..., s] = end
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for the two schedules above; guards a future one
            raise ScheduleError(f"schedule {kind!r} deadlocks")
    return last_backward, np.maximum(sends_done, last_backward)


def stage_allreduce_seconds(cluster: Cluster, assignments: np.ndarray, dp_bytes: np.ndarray) -> np.ndarray:
    """(..., S) scatter-gather all-reduce seconds of every stage's DP group (the "yuan" dp_s formula)
    for `dp_bytes[s]` gradient bytes per device of stage s."""
    assignments = np.asarray(assignments, dtype=np.int64)
    R = assignments.shape[-1]
    a, b = assignments[..., :, :, None], assignments[..., :, None, :]
    bandwidth = cluster.bandwidth_bps[a, b]
    share = 8.0 * np.asarray(dp_bytes, dtype=float)[..., None, None] / R  # (S,) or (..., S) bytes
    pair = 2.0 * (cluster.latency_s[a, b] + np.divide(share, bandwidth, out=np.zeros(bandwidth.shape), where=bandwidth > 0))
    pair = np.where(a == b, 0.0, pair)
    return pair.sum(axis=-1).max(axis=-1)


ALLREDUCE_ALGORITHMS = ("scatter-gather", "ring")


def schedule_seconds(cluster: Cluster, assignments: np.ndarray, forward_s: np.ndarray, message_bytes: float,
                     dp_bytes: np.ndarray, microbatches: int, kind: str, allreduce: str = "scatter-gather",
                     nic_bps: np.ndarray | None = None, stage_scale: np.ndarray | None = None,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The simulation from traffic: `forward_s` per device (N,) seconds of one micro-batch forward,
    `message_bytes` per activation (and gradient) message, `dp_bytes` (S,) gradient bytes per device,
    `allreduce` "scatter-gather" (yuan's dp_s) or "ring" (in replica order, as gloo runs it),
    `nic_bps` (N,) each device's NIC (None: unlimited), `stage_scale` (S,) or (..., S): stage s's forward
    is forward_s x stage_scale[s] (an uneven layer split: S x its share; None: 1).
    Returns (when each stage's group may start its all-reduce: the last replica's last backward done
    and its last message sent, (..., S); all-reduce seconds (..., S)); the iteration is max_s of their sum."""
    from geotrain.cost.ring import ring_allreduce_seconds  # ring.py builds on yuan.py, as this module

    assignments = np.asarray(assignments, dtype=np.int64)
    chains = np.swapaxes(assignments, -1, -2)  # (..., R, S)
    src, dst = chains[..., :-1], chains[..., 1:]
    bandwidth = cluster.bandwidth_bps[src, dst]
    nic_busy = None
    if nic_bps is not None:
        nic = np.asarray(nic_bps, dtype=float)
        bandwidth = np.minimum(bandwidth, nic[src])
        nic_busy = 8.0 * message_bytes / nic[chains]
    busy = np.divide(8.0 * message_bytes, bandwidth, out=np.zeros(bandwidth.shape), where=bandwidth > 0)
    forward = np.asarray(forward_s)[chains]
    if stage_scale is not None:
        forward = forward * np.asarray(stage_scale, dtype=float)[..., None, :]
    _, ready = simulate_pipeline_sends(forward, busy, cluster.latency_s[src, dst],
                                       microbatches, kind, nic_busy)
    if allreduce == "ring":
        dp = ring_allreduce_seconds(cluster, assignments, dp_bytes, nic_bps)
    elif allreduce == "scatter-gather":
        dp = stage_allreduce_seconds(cluster, assignments, dp_bytes)
    else:
        raise ScheduleError(f"unknown all-reduce {allreduce!r} (known: {', '.join(ALLREDUCE_ALGORITHMS)})")
    return ready.max(axis=-2), dp


class ScheduleCostModel:
    """Event-simulated iteration seconds (see the module docstring). Not pairwise."""

    name = "schedule"

    def __init__(self, cluster: Cluster, job: Job, stages: int, replicas: int, *, micro_batches: int | None = None,
                 schedule: str = "1f1b", utilisation: float = DEFAULT_UTILISATION, layer_shares: object = None) -> None:
        """`layer_shares`: None / "equal" (1/S), "speed" (per assignment) or S fractions summing to 1."""
        self.comm = YuanCostModel(cluster, job, stages, replicas)
        self.stages, self.replicas, self.n_devices = stages, replicas, cluster.n_devices
        self.micro_batches = micro_batches or max(1, job.global_batch // replicas)
        if isinstance(self.micro_batches, bool) or not isinstance(self.micro_batches, int) or self.micro_batches < 1:
            raise ScheduleError(f"micro-batches must be an integer >= 1, got {micro_batches!r}")
        pipeline_order(schedule, 0, stages, 1)  # validates the name
        self.schedule = schedule
        peak = np.array([gpu_peak_flops(gpu) for gpu in cluster.gpus]) * utilisation
        forward_flops = job.flops_per_iteration() / 3.0 / (stages * replicas * self.micro_batches)
        self.cluster = cluster
        self.forward_s = forward_flops / peak
        self.message_bytes = job.pp_bytes(replicas) / self.micro_batches
        self.dp_bytes = np.full(stages, job.dp_bytes(stages))
        self.shares = StageShares.build(layer_shares, stages, job.layers, device_peak_flops(cluster))
        self.model_grad_bytes = job.dp_bytes(1)

    def pairwise_terms(self) -> None:
        return None

    @property
    def surrogate(self) -> YuanCostModel:
        """The pairwise "yuan" model of the same layout: what search optimises before this model ranks."""
        return self.comm

    def _simulate(self, assignments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.shares is None:
            return schedule_seconds(self.cluster, assignments, self.forward_s, self.message_bytes, self.dp_bytes,
                                    self.micro_batches, self.schedule)
        shares = self.shares.of(assignments)
        return schedule_seconds(self.cluster, assignments, self.forward_s, self.message_bytes,
                                self.model_grad_bytes * shares, self.micro_batches, self.schedule,
                                stage_scale=self.stages * shares)

    def evaluate(self, assignment: np.ndarray) -> CostBreakdown:
        assignment = np.asarray(assignment, dtype=np.int64)
        ends, dp_per_stage = self._simulate(assignment)
        pp_per_replica = self.comm.replica_pp_seconds(assignment)
        total = float((ends + dp_per_stage).max())
        pipeline = float(ends.max())
        return CostBreakdown(dp=float(dp_per_stage.max()), pp=float(pp_per_replica.max()), total=total,
                             dp_per_stage=dp_per_stage, pp_per_replica=pp_per_replica,
                             extra={"pipeline": pipeline, "exposed_dp": total - pipeline})

    def evaluate_many(self, assignments: np.ndarray) -> np.ndarray:
        ends, dp = self._simulate(np.asarray(assignments, dtype=np.int64))
        return (ends + dp).max(axis=-1)
