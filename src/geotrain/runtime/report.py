"""From every rank's per-step records to per-iteration rows: loss, time, compute, measured and predicted comm.

Measured communication of one iteration, aggregated exactly as the cost model aggregates:
  pp_r  = sum over cuts of replica r of the busy time of its forward link (activations) and its
          backward link (gradients): the union of [hand-off, delivery] of that link's messages;
  dp_s  = the longest DP-exchange time (after the barrier) among the members of stage s;
  comm  = max_s dp_s + max_r pp_r.
Predicted communication: the yuan model with this run's real payload bytes, time-scaled, the DP
exchange charged once per `--sync-every` H steps (predict.py).
Predicted iteration, per model of predict.ITERATION_MODELS ("schedule": the event simulation with each
slot's measured work of that iteration, inside the pipeline schedule and after it (slot_work_s: under
emulation all the rank's own seconds on its clock, host work included); "yuan"/"ring": their comm + the
slowest slot's work).
`replicas_in_sync`: every step, all replicas of each stage had bit-identical weights (a checksum).
Summary figures are means over iterations after the first (the first pays one-off set-up costs);
with a single iteration, that one.
Uneven runs (adaptive local steps, asynchronous outer updates: ranks take different numbers of steps) have one
row per step of the run's progress (runtime.report_progress), each from the records of the ranks' steps at that
point (per rank summed, the slowest rank's), at most `--steps` rows; a row's comm is compared with the prediction
only over the run (a sync falls in some rows, not in others: one row's error says nothing). An asynchronous
rank's exchange with the global model's server counts as its DP communication.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geotrain.runtime import report_progress as progress
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.links import busy_seconds
from geotrain.runtime.memory_use import config_state_bytes, memory_summary
from geotrain.runtime.predict import ITERATION_MODELS, CommPrediction, predict_comm, predict_iteration_s, sync_rate


@dataclass(frozen=True)
class IterationRow:
    """One training iteration, seconds (wall clock, emulated links) and the mean loss over replicas."""

    step: int
    loss: float
    iteration_s: float
    compute_s: float
    dp_measured_s: float
    pp_measured_s: float
    dp_predicted_s: float
    pp_predicted_s: float
    iteration_predicted_s: dict[str, float] = field(default_factory=dict)  # by model name
    # the emulated clock's view (emulated seconds, not time-scaled): this step's period, and the
    # models' predictions in the same unit (None without emulation or without a next step)
    iteration_emulated_s: float | None = None
    iteration_predicted_emulated_s: dict[str, float] = field(default_factory=dict)
    # without emulation (--time-scale 0: real links, e.g. netlab or real hosts): the models with the
    # cluster's links at face value and this step's measured compute, in wall seconds
    iteration_predicted_links_s: dict[str, float] = field(default_factory=dict)
    dp_bytes: int = 0
    """The most payload bytes one rank handed to its DP collectives this step (posted ones when they land)."""
    compared: bool = True
    """Whether this row's comm is compared with the prediction (error_pct; False in an uneven run's rows)."""

    @property
    def comm_measured_s(self) -> float:
        return self.dp_measured_s + self.pp_measured_s

    @property
    def comm_predicted_s(self) -> float:
        return self.dp_predicted_s + self.pp_predicted_s

    @property
    def error_pct(self) -> float | None:
        return relative_error_pct(self.comm_measured_s, self.comm_predicted_s) if self.compared else None

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "loss": self.loss, "iteration_s": self.iteration_s, "compute_s": self.compute_s,
                "comm_measured": {"dp": self.dp_measured_s, "pp": self.pp_measured_s, "total": self.comm_measured_s},
                "comm_predicted": {"dp": self.dp_predicted_s, "pp": self.pp_predicted_s, "total": self.comm_predicted_s},
                "error_pct": self.error_pct, "iteration_predicted": dict(self.iteration_predicted_s),
                "iteration_emulated_s": self.iteration_emulated_s,
                "iteration_predicted_emulated": dict(self.iteration_predicted_emulated_s),
                "iteration_predicted_links": dict(self.iteration_predicted_links_s), "dp_bytes": self.dp_bytes}


@dataclass(frozen=True)
class RunReport:
    """A finished run: its rows, payload sizes and prediction."""

    plan: str
    stages: int
    replicas: int
    assignment: list[list[int]]
    rows: tuple[IterationRow, ...]
    dp_bytes_per_stage: tuple[int, ...]
    pp_bytes_per_cut: int
    prediction: CommPrediction
    config: dict[str, Any]
    replicas_in_sync: bool
    validation: tuple[tuple[int, float], ...] = ()
    """(completed steps of the run, mean validation loss in nats) per evaluation of the global model."""
    replica_validation: tuple[tuple[int, int, float], ...] = ()
    """(replica, completed steps of the global model it scored, loss in nats): asynchronous --eval-local, each
    replica's own evaluations mid-run (report_progress.validations)."""
    uneven: bool = False
    """Ranks took different numbers of steps (adaptive local steps, asynchronous): rows by the run's progress."""
    boundaries: tuple[int, ...] = ()
    """The run's stage cut: layers [b_v, b_{v+1}) form pipeline stage v (runtime.stages)."""
    compute_fraction: dict[str, float] = field(default_factory=dict)
    """Per device (cluster name) of the plan: its mean compute seconds over the mean step seconds
    (iterations after the first; emulated seconds under emulation: step_seconds)."""
    step_s: float = 0.0
    """Mean step seconds (step_seconds) over the iterations after the first."""
    samples: tuple[int, ...] = ()
    """Sequences per replica per iteration (--batch-shares)."""
    memory: dict[str, Any] | None = None
    """What each rank held at the end beside the planner's state per device (runtime.memory_use.memory_summary)."""
    global_updates: int | None = None
    """Asynchronous outer updates: the replica outer gradients the final global model holds (None otherwise)."""
    pp_bytes_total: int = 0
    """Activation bytes replica 0 sent out of stage 0 over the run (its gradients came back as many): differs from
    steps x pp_bytes_per_cut where steps differ in width (a delta cut's first sights, runtime/delta_wire.py)."""
    cut_state: tuple[dict[str, Any], ...] = ()
    """A delta cut's per-sample state at the end, one entry per rank holding a side (rank, stage, replica, samples,
    state_bytes, fingerprint: equal on both sides of a replica's cut)."""

    @property
    def losses(self) -> list[float]:
        return [row.loss for row in self.rows]

    def _steady(self) -> Sequence[IterationRow]:
        return self.rows[1:] if len(self.rows) > 1 else self.rows

    def mean(self, attribute: str) -> float:
        return float(np.mean([getattr(row, attribute) for row in self._steady()]))

    def iteration_predicted_s(self, model: str) -> float:
        """Mean predicted iteration seconds of `model` over the summarised iterations."""
        return float(np.mean([row.iteration_predicted_s[model] for row in self._steady()]))

    def summary(self) -> dict[str, float]:
        measured, predicted = self.mean("comm_measured_s"), self.mean("comm_predicted_s")
        iteration = self.mean("iteration_s")
        by_model = {m: self.iteration_predicted_s(m) for m in self.rows[0].iteration_predicted_s}
        emulated_rows = [row for row in self._steady() if row.iteration_emulated_s is not None]
        emulated: dict[str, Any] = {}
        if emulated_rows:
            period = float(np.mean([row.iteration_emulated_s for row in emulated_rows]))
            by_model_emulated = {m: float(np.mean([row.iteration_predicted_emulated_s[m] for row in emulated_rows]))
                                 for m in emulated_rows[0].iteration_predicted_emulated_s}
            emulated = {"iteration_emulated_s": period, "iteration_predicted_emulated_s": by_model_emulated,
                        "iteration_emulated_error_pct": {m: relative_error_pct(period, p)
                                                         for m, p in by_model_emulated.items()}}
        links: dict[str, Any] = {}
        if self.rows[0].iteration_predicted_links_s:
            by_model_links = {m: float(np.mean([row.iteration_predicted_links_s[m] for row in self._steady()]))
                              for m in self.rows[0].iteration_predicted_links_s}
            links = {"iteration_predicted_links_s": by_model_links,
                     "iteration_links_error_pct": {m: relative_error_pct(iteration, p) for m, p in by_model_links.items()}}
        return {**emulated, **links, "iteration_predicted_s": by_model,
                "iteration_error_pct": {m: relative_error_pct(iteration, p) for m, p in by_model.items()},
                "iteration_s": self.mean("iteration_s"), "compute_s": self.mean("compute_s"),
                "comm_measured_s": measured, "comm_predicted_s": predicted,
                "dp_measured_s": self.mean("dp_measured_s"), "pp_measured_s": self.mean("pp_measured_s"),
                "dp_predicted_s": self.mean("dp_predicted_s"), "pp_predicted_s": self.mean("pp_predicted_s"),
                "error_pct": relative_error_pct(measured, predicted),
                "first_loss": self.rows[0].loss, "final_loss": self.rows[-1].loss,
                "replicas_in_sync": self.replicas_in_sync, "site_compute_fraction": dict(self.compute_fraction),
                "step_s": self.step_s,
                "samples_per_replica": list(self.samples), "memory": self.memory}

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan, "stages": self.stages, "replicas": self.replicas, "assignment": self.assignment,
                "losses": self.losses, "summary": self.summary(), "prediction": self.prediction.to_json(),
                "bytes": {"dp_per_stage": list(self.dp_bytes_per_stage), "pp_per_cut": self.pp_bytes_per_cut,
                          "pp_total": self.pp_bytes_total},
                "cut_state": list(self.cut_state),
                "iterations": [row.to_json() for row in self.rows], "config": self.config,
                "validation": [{"step": step, "loss": loss} for step, loss in self.validation],
                "replica_validation": [{"replica": replica, "step": step, "loss": loss}
                                       for replica, step, loss in self.replica_validation],
                "rows_by": "progress" if self.uneven else "step",
                "boundaries": list(self.boundaries)}


def relative_error_pct(measured: float, predicted: float) -> float:
    """(measured - predicted) / predicted in percent (0 when both are 0)."""
    if predicted == 0:
        return 0.0 if measured == 0 else float("inf")
    return 100.0 * (measured - predicted) / predicted


def _pp_seconds(records: Sequence[dict[str, Any]], stages: int, replicas: int) -> np.ndarray:
    """(R,) measured pipeline seconds of one step: per replica, the sum of its links' busy times."""
    links: dict[tuple[int, str, int], list[tuple[float, float]]] = defaultdict(list)
    for record in records:
        for kind, cut, _micro, _nbytes, handoff, end in record["transfers"]:
            links[(record["replica"], kind, cut)].append((handoff, end))
    per_replica = np.zeros(replicas)
    for (replica, _kind, _cut), intervals in links.items():
        per_replica[replica] += busy_seconds(intervals)
    return per_replica


def emulated_periods_s(by_step: dict[int, list[dict[str, Any]]], time_scale: float) -> dict[int, float]:
    """Emulated seconds from step k to step k + 1, by k: per replica, the emulated start of step k+1's
    first activation message less step k's (that message leaves an idle link at once, so its start is
    its hand-off after the first forward; the earliest "fwd" record of the step), max over replicas. Empty without emulation (time scale 0)
    or without activation messages (one stage)."""
    if time_scale <= 0:
        return {}
    first: dict[tuple[int, int], float] = {}
    for step, records in by_step.items():
        for record in records:
            starts = [t[4] for t in record["transfers"] if t[0] == "fwd"]
            if starts:
                first[(step, record["replica"])] = min(starts) / time_scale
    periods = {}
    for step in by_step:
        pairs = [(first[(step, r)], first[(step + 1, r)]) for (s, r) in first if s == step and (step + 1, r) in first]
        if pairs:
            periods[step] = max(after - before for before, after in pairs)
    return periods


def slot_work_s(record: dict[str, Any]) -> tuple[float, float]:
    """(seconds inside the pipeline schedule, seconds after it) a rank worked in a step record, what the
    iteration models take per slot. Under emulation its own work on its clock, not blocked on links
    (`busy_s`: timed compute and the host work around it, which the emulated clock counts alike), split
    where torch's schedule returns (`pipeline_busy_s`); else the timed compute, its gradient sync's part
    (`sync_compute_s`: codecs, clipping, optimizer) after the schedule."""
    span = record.get("emulated") or {}
    inside = record.get("pipeline_busy_s")
    if inside is not None and span.get("busy_s") is not None:
        return float(inside), float(span["busy_s"]) - float(inside)
    after = float(record.get("sync_compute_s", 0.0))
    return float(record["compute_s"]) - after, after


def dp_seconds(record: dict[str, Any], time_scale: float) -> float:
    """A record's DP communication seconds (wall, emulated links time-scaled): its collectives and an asynchronous
    exchange (`exchange_s`: emulated seconds under emulation, else wall)."""
    exchange = float(record.get("exchange_s", 0.0))
    return record["dp_s"] + (exchange * time_scale if record.get("emulated") else exchange)


def _busiest(step_records: Sequence[dict[str, Any]], seconds: Any) -> float:
    """The most seconds(record) one rank summed over its records of a row (one record each in lock-step)."""
    per_rank: dict[tuple[int, int, int], float] = defaultdict(float)
    for record in step_records:
        per_rank[(record["stage"], record["replica"], record.get("shard", 0))] += seconds(record)
    return max(per_rank.values())


def build_report(config: RuntimeConfig, records: Sequence[dict[str, Any]]) -> RunReport:
    """Aggregate the gathered records of all ranks (any order) into a RunReport."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    uneven = progress.uneven(records)
    if uneven:
        by_step.update(progress.progress_groups(records, config.run.steps))
    else:
        for record in records:
            by_step[record["step"]].append(record)
    stages, replicas = config.stages, config.replicas
    dp_bytes = [0] * stages
    pp_bytes = pp_total = 0
    for record in records:  # the largest exchange of a step (with --sync-every, most steps exchange nothing)
        dp_bytes[record["stage"]] = max(dp_bytes[record["stage"]], int(record["dp_bytes"]))
        if record["stage"] == 0 and record["replica"] == 0:  # activations replica 0 sends out of stage 0
            pp_bytes = int(record.get("pp_bytes", 0))
            pp_total += pp_bytes
    virtual = config.stages_per_rank
    rate = sync_rate(config.optim.sync_every, config.optim.fragments)  # --sync-every H: one exchange per H steps
    prediction = predict_comm(config.cluster, config.assignment, dp_bytes, pp_bytes, config.emulation.time_scale,
                              virtual_stages=virtual, syncs_per_step=rate)

    def iteration_predictions(step_records: Sequence[dict[str, Any]], time_scale: float) -> dict[str, float]:
        compute, after = np.zeros((stages, replicas)), np.zeros((stages, replicas))
        for record in step_records:
            inside, outside = slot_work_s(record)
            compute[record["stage"], record["replica"]] += inside / config.layout.k  # a slot's mean
            after[record["stage"], record["replica"]] += outside / config.layout.k
        return {model: predict_iteration_s(config.cluster, config.assignment, compute, dp_bytes, pp_bytes,
                                           config.schedule.microbatches, config.schedule.schedule, time_scale, model,
                                           virtual, rate, after)
                for model in ITERATION_MODELS}

    periods = emulated_periods_s(by_step, config.emulation.time_scale)
    rows = []
    in_sync = True
    for step in sorted(by_step):
        step_records = by_step[step]
        dp_by_stage = np.zeros(stages)
        for stage in range(stages):
            of_stage = [r for r in step_records if r["stage"] == stage]
            if of_stage:
                dp_by_stage[stage] = _busiest(of_stage, lambda r: dp_seconds(r, config.emulation.time_scale))
        # the mean over the replicas' sequences (--batch-shares: replicas hold different numbers of them)
        losses = [r["loss"] for r in step_records if r["loss"] is not None]
        weights = [r.get("samples", 1) for r in step_records if r["loss"] is not None]
        if not uneven:
            for stage, shard in np.ndindex(stages, config.layout.k):  # each shard of a sharded slot with its peers
                in_sync &= len({r["param_sum"] for r in step_records
                                if r["stage"] == stage and r.get("shard", 0) == shard}) == 1
        rows.append(IterationRow(
            step=step, loss=float(np.average(losses, weights=weights)),
            iteration_s=_busiest(step_records, lambda r: r["iteration_s"]),
            compute_s=_busiest(step_records, lambda r: r["compute_s"]),
            dp_measured_s=float(dp_by_stage.max()),
            pp_measured_s=float(_pp_seconds(step_records, stages, replicas).max()),
            dp_predicted_s=prediction.dp_s, pp_predicted_s=prediction.pp_s,
            iteration_predicted_s=iteration_predictions(step_records, config.emulation.time_scale),
            iteration_emulated_s=periods.get(step),
            iteration_predicted_emulated_s=iteration_predictions(step_records, 1.0) if step in periods else {},
            iteration_predicted_links_s=(iteration_predictions(step_records, 1.0) if config.emulation.time_scale <= 0
                                         else {}),
            dp_bytes=max(int(r["dp_bytes"]) for r in step_records), compared=not uneven))
    # adaptive local steps (records with outer_step): ranks agree on the anchor between the same landed syncs, not
    # at a step index
    by_period: dict[tuple[int, int, int], set[float]] = defaultdict(set)
    for record in records:
        if "outer_step" in record:
            by_period[(record.get("syncs_landed", record["outer_step"]), record["stage"],
                       record.get("shard", 0))].add(record["param_sum"])
    in_sync &= all(len(sums) == 1 for sums in by_period.values())
    if progress.asynchronous(records):  # replicas hold different global models until the end's exchange
        in_sync = progress.final_models_agree(records)
    validation, replica_validation = progress.validations(records, config.run.steps, config.optim.sync_every,
                                                          replicas)
    per_replica = {r["replica"]: int(r.get("samples", config.schedule.batch_size)) for r in records}
    samples = tuple(per_replica.get(replica, config.schedule.batch_size) for replica in range(replicas))
    return RunReport(plan=config.plan_name, stages=stages, replicas=replicas, assignment=config.assignment.tolist(),
                     rows=tuple(rows), dp_bytes_per_stage=tuple(dp_bytes), pp_bytes_per_cut=pp_bytes,
                     pp_bytes_total=pp_total,
                     cut_state=tuple({"rank": r["rank"], "stage": r["stage"], "replica": r["replica"], **r["cut_state"]}
                                     for r in records if "cut_state" in r),
                     prediction=prediction, config=config.to_json(), replicas_in_sync=in_sync,
                     validation=tuple(validation), replica_validation=tuple(replica_validation), uneven=uneven,
                     boundaries=tuple(records[0].get("boundaries", ())) if records else (),
                     compute_fraction=slot_compute_fraction(config, by_step), samples=samples,
                     memory=memory_summary(records, config_state_bytes(config)),
                     global_updates=max((int(r["global_updates"]) for r in records if "global_updates" in r),
                                        default=None),
                     step_s=(progress.progress_step_s(records, config.run.steps) if uneven else
                             float(np.mean([step_seconds(by_step[k]) for k in steady_steps(by_step)]))))


def steady_steps(by_step: dict[int, Any]) -> list[int]:
    """The steps summarised: after the first (it pays set-up costs), or the only one."""
    return sorted(by_step)[1:] or sorted(by_step)


def step_seconds(step_records: Sequence[dict[str, Any]]) -> float:
    """One step's seconds: under emulation the longest emulated span of a rank's step (its clock from the
    step's start to its end: compute at the emulated speed, links as emulated), else the longest wall
    iteration_s."""
    spans = [r["emulated"]["end_s"] - r["emulated"]["start_s"] for r in step_records if r.get("emulated")]
    return max(spans) if spans else max(r["iteration_s"] for r in step_records)


def slot_compute_fraction(config: RuntimeConfig, by_step: dict[int, list[dict[str, Any]]]) -> dict[str, float]:
    """Device name -> mean compute_s of its slot over the mean step seconds (step_seconds), over the steps
    after the first (all of them with one step). Ranks not in lock-step (adaptive local steps, asynchronous
    outer updates: their step indices do not line up) by their own pace instead (own_pace_compute_fraction)."""
    records = [record for step_records in by_step.values() for record in step_records]
    if any("outer_step" in r or "global_updates" in r for r in records):
        return own_pace_compute_fraction(config, records)
    steps = steady_steps(by_step)
    iteration = float(np.mean([step_seconds(by_step[step]) for step in steps]))
    names = config.cluster.device_names
    compute: dict[str, list[float]] = defaultdict(list)
    for step in steps:
        for record in by_step[step]:
            compute[names[config.assignment[record["stage"], record["replica"]]]].append(record["compute_s"])
    return {name: float(np.mean(values)) / iteration if iteration > 0 else 0.0 for name, values in compute.items()}


def own_pace_compute_fraction(config: RuntimeConfig, records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Device name -> its slot's compute seconds over its own run: under emulation its clock from its first
    step's start to its last step's end (the end's exchange included), else the sum of its iterations' wall
    seconds."""
    names = config.cluster.device_names
    compute: dict[str, float] = defaultdict(float)
    first: dict[str, float] = {}
    last: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    for record in records:
        name = names[config.assignment[record["stage"], record["replica"]]]
        compute[name] += record["compute_s"]
        wall[name] += record["iteration_s"]
        if record.get("emulated"):
            first[name] = min(first.get(name, math.inf), record["emulated"]["start_s"])
            last[name] = max(last[name], record["emulated"]["end_s"])
    span = {name: (last[name] - first[name]) if name in first else wall[name] for name in compute}
    return {name: compute[name] / span[name] if span[name] > 0 else 0.0 for name in compute}
