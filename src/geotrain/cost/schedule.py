"""The "schedule" model: iteration seconds from an exact event simulation of the pipeline schedule.

What it adds over "yuan" (communication only, each replica's cuts in series, whole-iteration bytes)
and "yuan+compute" (a closed-form GPipe bubble, no overlap): per-micro-batch compute and transfers,
latency paid per message but pipelined, FIFO link queues, the schedule's real op order, and the
DP all-reduce of each stage overlapped with the other stages' remaining work.

Inputs: the cluster, the Traffic (cost/traffic.py) and each device's compute seconds of one
micro-batch forward (`forward_s`; `for_job` derives it from FLOPs: 2 x params/S x seq x b, b =
global_batch / (R M) sequences, at peak_flops(gpu) x utilisation; the runtime passes measured
compute). Per replica r with devices d_0 .. d_{S-1} and V pipeline stages per device (stage v on
d_{v mod S}; V > 1 for the looped schedules), M micro-batches:
- order: each device runs its compute actions in the order of `schedule_actions` (cost/actions.py:
  read from torch.distributed.pipelining, the order `geotrain train` runs) - GPipe, 1F1B,
  interleaved 1F1B and looped BFS alike. Forward of stage v: forward_s(d) / V; backward twice that.
- transfers: after F of micro-batch m at stage v, its activations (pp_bytes[v] / M bytes) go to the
  device of v + 1; after B at v > 0, the input gradient (same size) goes back. Each directed
  device pair is a FIFO queue: start = max(handed over, link free), busy 8 bytes / bandwidth,
  arrives `latency` after it ends (the runtime's link emulation, runtime/links.py, does the same).
  Stages on one device hand over without a link.
- F at v starts when the device is free and the activation has arrived; B at v < P-1 when the
  gradient from v + 1 has arrived; B at the last stage follows its own F in the device order.
- DP: stage s's all-reduce starts when every replica has finished its last backward on d_s and its
  last message has left the device (a stage waits for its sends before the all-reduce), and takes
  "yuan"'s dp_s (scatter-gather formula) or, with allreduce="ring", the ring all-reduce in replica
  order (gloo's; cost/ring.ring_allreduce_seconds); it overlaps whatever other stages still do.
  iteration = max_s (max_r ready at s + dp_s / H + after_s), H = traffic.sync_period (the exchange
  amortised).
- after (optional, `after_s` per device): what a device works after its stage's all-reduce before its
  next iteration starts: the optimizer step, and the runtime's host work outside the schedule (drawing
  the batch, the step's bookkeeping); after_s at stage s = the slowest of its replicas. It sits after
  the exchange, in series, where it delays the next iteration's first forward: spread over the
  micro-batches' compute instead, most of it would hide behind the links (2026-12-07,
  docs/history/runtime.md: the runtime's optimizer and host work, ~40 ms of a 0.35 s iteration).
- NIC (optional, `nic_bps` per device): caps every message's rate; a device's messages to both
  neighbours also queue FIFO on its NIC, each busy 8 bytes / nic.
- uneven split (`shares`, cost/layer_split.py): stage s holds a fraction f_s of the layers, so
  its forward is f_s x S times the 1/S figure above and its gradient f_s x the model's gradient
  bytes; "speed" gives every assignment the speed-optimal integer split of the job's layers.
- sharded replicas (`sharding`, cost/shards.py: the cluster is a slot cluster of K devices per slot): forward_s
  is the slot's micro-batch forward / K, plus its FSDP seconds per step (Sharding.fsdp_seconds) spread over the
  step's 3 M forward-units (not overlapped).
Simplifications: all-reduce traffic does not share links with activations; compute does not slow
down communication; wire bytes (codecs) are not applied; without shares each stage's gradient is
traffic.dp_bytes[s]. Vectorised over replicas (and over a batch of assignments); the loop runs over
the 2 P M actions once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.actions import Action, ScheduleError, schedule_actions
from geotrain.cost.base import CostBreakdown
from geotrain.cost.gpus import DEFAULT_UTILISATION, gpu_peak_flops
from geotrain.cost.layer_split import StageShares, device_peak_flops
from geotrain.cost.shards import NO_SHARDING, Sharding, largest_stage_param_bytes
from geotrain.cost.traffic import Traffic, traffic_of_job
from geotrain.cost.yuan import YuanCostModel
from geotrain.job import Job

__all__ = ["ScheduleCostModel", "ScheduleError", "pipeline_order", "schedule_seconds", "simulate_actions",
           "simulate_pipeline", "simulate_pipeline_sends", "stage_allreduce_seconds"]


def pipeline_order(kind: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The ("F" | "B", micro-batch) ops of `stage` in execution order, for a one-stage-per-device schedule."""
    return [(a.op, a.microbatch) for a in schedule_actions(kind, stages, microbatches)[stage]]


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
    """`simulate_pipeline`, plus (..., S) the time each stage's last message has left its device.
    `nic_busy_s[..., s]`: seconds one message occupies stage s's NIC (None: unlimited NIC)."""
    forward_s = np.asarray(forward_s, dtype=float)
    nic = None if nic_busy_s is None else (nic_busy_s[..., :-1], nic_busy_s[..., 1:])
    return simulate_actions(schedule_actions(kind, forward_s.shape[-1], microbatches), forward_s,
                            send_busy_s, send_latency_s, nic)


def simulate_actions(actions: Sequence[Sequence[Action]], forward_s: np.ndarray, cut_busy_s: np.ndarray,
                     cut_latency_s: np.ndarray, nic_busy_s: tuple[np.ndarray, np.ndarray] | None = None,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Run per-device action lists (S devices, P = len(forward_s) pipeline stages, stage v on device
    v mod S): forward_s[..., v] per micro-batch forward of stage v (backward twice that); cut c
    (stage c <-> c + 1) busy cut_busy_s[..., c] and adding cut_latency_s[..., c] per message, both
    directions; `nic_busy_s` (forward, backward), each (..., P-1): seconds the sender's NIC holds one
    message of cut c (None: unlimited). Returns (..., S) twice: the end of each device's last
    backward, and the time its last message has left it (no earlier than that backward)."""
    S = len(actions)
    shape = np.shape(forward_s)[:-1]
    device_free = np.zeros(shape + (S,))
    last_backward = np.zeros(shape + (S,))
    nic_free = np.zeros(shape + (S,))
    sends_done = np.zeros(shape + (S,))
    link_free: dict[tuple[int, int], np.ndarray] = {}  # directed device pair -> when it is free
    arrival: dict[tuple[str, int, int], np.ndarray] = {}  # ("F" | "B", stage to run, m) -> input arrives
    last = np.shape(forward_s)[-1] - 1

    def post(cut: int, sender: int, receiver: int, handed: np.ndarray, nic: np.ndarray | None) -> np.ndarray:
        """FIFO on the directed device pair (and the sender's NIC): the message's arrival."""
        if sender == receiver:
            return handed
        start = np.maximum(handed, link_free.get((sender, receiver), 0.0))
        if nic is not None:
            start = np.maximum(start, nic_free[..., sender])
            nic_free[..., sender] = start + nic[..., cut]
        done = start + cut_busy_s[..., cut]
        link_free[(sender, receiver)] = done
        sends_done[..., sender] = np.maximum(sends_done[..., sender], done)
        return done + cut_latency_s[..., cut]

    position = [0] * S
    remaining = sum(len(ops) for ops in actions)
    while remaining:
        progressed = False
        for s in range(S):
            while position[s] < len(actions[s]):
                op, v, m = actions[s][position[s]]
                needs_input = v > 0 if op == "F" else v < last
                ready = arrival.pop((op, v, m), None) if needs_input else 0.0
                if ready is None:
                    break
                end = np.maximum(device_free[..., s], ready) + forward_s[..., v] * (1.0 if op == "F" else 2.0)
                if op == "F" and v < last:
                    arrival[("F", v + 1, m)] = post(v, s, (v + 1) % S, end, None if nic_busy_s is None else nic_busy_s[0])
                if op == "B":
                    last_backward[..., s] = end
                    if v > 0:
                        arrival[("B", v - 1, m)] = post(v - 1, s, (v - 1) % S, end,
                                                        None if nic_busy_s is None else nic_busy_s[1])
                device_free[..., s] = end
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ScheduleError(f"the action lists deadlock at positions {position}")
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


def schedule_seconds(cluster: Cluster, assignments: np.ndarray, forward_s: np.ndarray, message_bytes: float | np.ndarray,
                     dp_bytes: np.ndarray, microbatches: int, kind: str, allreduce: str = "scatter-gather",
                     nic_bps: np.ndarray | None = None, stage_scale: np.ndarray | None = None,
                     actions: Sequence[Sequence[Action]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The simulation from traffic: `forward_s` per device (N,) seconds of one micro-batch forward
    (all its stages), `message_bytes` per activation (and gradient) message, one number or one per
    cut (P - 1,), `dp_bytes` (S,) gradient bytes per device, `allreduce` "scatter-gather" (yuan's
    dp_s) or "ring" (in replica order, as gloo runs it), `nic_bps` (N,) each device's NIC (None:
    unlimited), `stage_scale` (S,) or (..., S): stage s's forward is forward_s x stage_scale[s] (an
    uneven layer split: S x its share; None: 1), `actions`: the per-device order (None:
    schedule_actions(kind, S, microbatches); its P / S stages per device split forward_s evenly).
    Returns (when each stage's group may start its all-reduce: the last replica's last backward done
    and its last message sent, (..., S); all-reduce seconds (..., S)); the iteration is max_s of their sum."""
    from geotrain.cost.ring import ring_allreduce_seconds  # ring.py builds on yuan.py, as this module

    assignments = np.asarray(assignments, dtype=np.int64)
    S = assignments.shape[-2]
    actions = schedule_actions(kind, S, microbatches) if actions is None else actions
    virtual = max((a.stage for ops in actions for a in ops), default=S - 1) // S + 1
    chains = np.swapaxes(assignments, -1, -2)  # (..., R, S)
    cuts = np.arange(S * virtual - 1)
    src, dst = chains[..., cuts % S], chains[..., (cuts + 1) % S]
    message = np.broadcast_to(np.asarray(message_bytes, dtype=float), cuts.shape)
    bandwidth = cluster.bandwidth_bps[src, dst]
    nic_busy = None
    if nic_bps is not None:
        nic = np.asarray(nic_bps, dtype=float)
        bandwidth = np.minimum(bandwidth, nic[src])
        nic_busy = (8.0 * message / nic[src], 8.0 * message / nic[dst])
    busy = np.divide(8.0 * message, bandwidth, out=np.zeros(bandwidth.shape), where=bandwidth > 0)
    forward = np.asarray(forward_s, dtype=float)[chains]
    if stage_scale is not None:
        forward = forward * np.asarray(stage_scale, dtype=float)[..., None, :]
    if virtual > 1:
        forward = np.tile(forward / virtual, virtual)  # stage v on device v mod S
    _, ready = simulate_actions(actions, forward, busy, cluster.latency_s[src, dst], nic_busy)
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

    def __init__(self, cluster: Cluster, traffic: Traffic, forward_s: np.ndarray, micro_batches: int, *,
                 schedule: str = "1f1b", allreduce: str = "scatter-gather", nic_bps: np.ndarray | None = None,
                 shares: StageShares | None = None, after_s: np.ndarray | None = None) -> None:
        """`forward_s` (N,): each device's seconds of one micro-batch forward of its 1/S of the layers;
        `micro_batches` M per replica and iteration; `shares`: an uneven layer split (None: 1/S);
        `after_s` (N,): each device's seconds after its stage's all-reduce (None: 0; module doc)."""
        self.comm = YuanCostModel(cluster, traffic)
        self.stages, self.replicas, self.n_devices = traffic.stages, traffic.replicas, cluster.n_devices
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
            raise ScheduleError(f"micro-batches must be an integer >= 1, got {micro_batches!r}")
        if allreduce not in ALLREDUCE_ALGORITHMS:
            raise ScheduleError(f"unknown all-reduce {allreduce!r} (known: {', '.join(ALLREDUCE_ALGORITHMS)})")
        self.micro_batches = micro_batches
        self.schedule = schedule
        self.actions = schedule_actions(schedule, traffic.stages, micro_batches, traffic.virtual_stages)
        self.cluster = cluster
        self.traffic = traffic
        self.forward_s = np.asarray(forward_s, dtype=float)
        self.message_bytes = np.asarray(traffic.pp_bytes, dtype=float) / micro_batches
        self.dp_bytes = np.asarray(traffic.dp_bytes, dtype=float)
        self.allreduce, self.nic_bps = allreduce, nic_bps
        self.shares = shares
        self.after_s = np.zeros(cluster.n_devices) if after_s is None else np.asarray(after_s, dtype=float)
        self.model_grad_bytes = float(self.dp_bytes.sum())

    @classmethod
    def for_job(cls, cluster: Cluster, job: Job, stages: int, replicas: int, *, micro_batches: int | None = None,
                schedule: str = "1f1b", utilisation: float = DEFAULT_UTILISATION,
                layer_shares: object = None, sync_period: int = 1,
                sharding: Sharding = NO_SHARDING) -> ScheduleCostModel:
        """`job`'s traffic and FLOPs (forward 1/3 of 6 x params x tokens) at `utilisation` of each
        GPU's peak; `layer_shares`: None / "equal" (1/S), "speed" (per assignment) or S fractions;
        `sync_period` H: the DP exchange every H steps (its seconds per iteration / H); `sharding`: `cluster`
        is a slot cluster of sharding.k devices per slot (cost/shards.py)."""
        traffic = traffic_of_job(job, stages, replicas, n_devices=cluster.n_devices, sync_period=sync_period)
        m = micro_batches or max(1, job.global_batch // replicas)
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ScheduleError(f"micro-batches must be an integer >= 1, got {micro_batches!r}")
        peak = np.array([gpu_peak_flops(gpu) for gpu in cluster.gpus]) * utilisation
        forward_flops = job.flops_per_iteration() / 3.0 / (stages * replicas * m * sharding.k)
        fsdp = sharding.fsdp_seconds(cluster, largest_stage_param_bytes(job, stages)) / (3.0 * m)
        return cls(cluster, traffic, forward_flops / peak + fsdp, m, schedule=schedule,
                   shares=StageShares.build(layer_shares, stages, job.layers, device_peak_flops(cluster)))

    def pairwise_terms(self) -> None:
        return None

    @property
    def surrogate(self) -> YuanCostModel:
        """The pairwise "yuan" model of the same layout: what search optimises before this model ranks."""
        return self.comm

    def _simulate(self, assignments: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(..., S) three times: when each stage's all-reduce may start, its all-reduce seconds (per
        iteration), and the slowest of its replicas' `after_s` (what follows the exchange, in series)."""
        common = dict(allreduce=self.allreduce, nic_bps=self.nic_bps, actions=self.actions)
        if self.shares is None:
            ready, dp = schedule_seconds(self.cluster, assignments, self.forward_s, self.message_bytes, self.dp_bytes,
                                         self.micro_batches, self.schedule, **common)
        else:
            shares = self.shares.of(assignments)
            ready, dp = schedule_seconds(self.cluster, assignments, self.forward_s, self.message_bytes,
                                         self.model_grad_bytes * shares, self.micro_batches, self.schedule,
                                         stage_scale=self.stages * shares, **common)
        dp = dp if self.traffic.sync_period == 1 else dp / self.traffic.sync_period
        return ready, dp, self.after_s[np.asarray(assignments, dtype=np.int64)].max(axis=-1)

    def evaluate(self, assignment: np.ndarray) -> CostBreakdown:
        assignment = np.asarray(assignment, dtype=np.int64)
        ends, dp_per_stage, after = self._simulate(assignment)
        pp_per_replica = self.comm.replica_pp_seconds(assignment)
        total = float((ends + dp_per_stage + after).max())
        pipeline = float(ends.max())
        exposed_dp = float((ends + dp_per_stage).max()) - pipeline
        return CostBreakdown(dp=float(dp_per_stage.max()), pp=float(pp_per_replica.max()), total=total,
                             dp_per_stage=dp_per_stage, pp_per_replica=pp_per_replica,
                             extra={"pipeline": pipeline, "exposed_dp": exposed_dp,
                                    **({"after": total - pipeline - exposed_dp} if self.after_s.any() else {})})

    def evaluate_many(self, assignments: np.ndarray) -> np.ndarray:
        ends, dp, after = self._simulate(np.asarray(assignments, dtype=np.int64))
        return (ends + dp + after).max(axis=-1)
