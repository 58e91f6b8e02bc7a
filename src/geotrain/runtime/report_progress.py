"""Uneven runs by the run's progress: ranks that take different numbers of inner steps (adaptive local steps,
asynchronous outer updates) labelled by where the run is, not by each rank's own step count.

The run's progress is a 0-based step of the equal schedule (R replicas x one inner step each, `--steps` of them):
each worker record carries it as `progress_step` (runtime.worker: the rank's own step in lock-step runs; with
adaptive local steps its place in its period, sync.adaptive.progress_step; asynchronous, the replica updates of the
global model the step started from x H / R, sync.async_step.progress_steps).

    uneven(records)                  True for adaptive or asynchronous records
    progress_groups(records, steps)  {progress step: its records}, steps past the run's last folded into it
    validations(records, ...)        (the global model's evaluations, each replica's own evaluations)
    progress_step_s(records, steps)  seconds per step of the run's progress (start-up excluded)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from geotrain.sync.async_step import progress_steps


def uneven(records: Sequence[dict[str, Any]]) -> bool:
    """Whether the ranks' step indices do not line up: adaptive local steps (`outer_step`) or asynchronous outer
    updates (`global_updates`)."""
    return any("outer_step" in r or "global_updates" in r for r in records)


def asynchronous(records: Sequence[dict[str, Any]]) -> bool:
    return any("global_updates" in r for r in records)


def progress_groups(records: Sequence[dict[str, Any]], steps: int) -> dict[int, list[dict[str, Any]]]:
    """The records by their progress step (0 .. steps - 1; a record without one by its own step). A record past
    the run's last step (an asynchronous rank still stepping when the global model reached its budget) is in the
    last one's group."""
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        groups[min(int(record.get("progress_step", record["step"])), steps - 1)].append(record)
    return dict(groups)


def validations(records: Sequence[dict[str, Any]], steps: int, sync_every: int | None,
                replicas: int) -> tuple[list[tuple[int, float]], list[tuple[int, int, float]]]:
    """(global, per replica): the global model's evaluations as (completed steps of the run, loss), one per
    evaluation (every rank that took part in it records the same loss: the mean if they differ), and the
    evaluations a replica ran alone on its own copy of the global model (asynchronous `--eval-local`, mid-run) as
    (replica, completed steps of the global model it scored, loss). Labels: lock-step, the step's count; adaptive,
    the syncs done x H (at most `steps`); asynchronous, `steps` at the end (every rank scores the final model) and
    progress_steps(global updates) mid-run."""
    scored: dict[int, list[float]] = defaultdict(list)
    alone: dict[tuple[int, int], list[float]] = defaultdict(list)
    last: dict[tuple[int, int], int] = {}
    for r in records:
        key = (r["stage"], r["replica"])
        last[key] = max(last.get(key, -1), r["step"])
    for r in records:
        loss = r.get("val_loss")
        if loss is None:
            continue
        if "global_updates" in r:
            if r["step"] == last[(r["stage"], r["replica"])]:
                scored[steps].append(loss)
            else:
                done = min(steps, progress_steps(int(r["global_updates"]), int(sync_every or 1), replicas))
                alone[(r["replica"], done)].append(loss)
        elif "outer_step" in r:
            scored[min(int(r["outer_step"]) * int(sync_every or 1), steps)].append(loss)
        else:
            scored[r["step"] + 1].append(loss)
    by_progress = sorted(alone.items(), key=lambda item: (item[0][1], item[0][0]))
    return ([(step, sum(v) / len(v)) for step, v in sorted(scored.items())],
            [(replica, step, sum(v) / len(v)) for (replica, step), v in by_progress])


def progress_step_s(records: Sequence[dict[str, Any]], steps: int) -> float:
    """Seconds per step of the run's progress: under emulation the run's span on the emulated clock (the earliest
    first step's start to the latest end: start-up excluded) over `steps`, else the busiest rank's wall seconds in
    its steps over `steps`."""
    spans = [r["emulated"] for r in records if r.get("emulated")]
    if spans:
        return (max(s["end_s"] for s in spans) - min(s["start_s"] for s in spans)) / steps
    wall: dict[tuple[int, int], float] = defaultdict(float)
    for r in records:
        wall[(r["stage"], r["replica"])] += r["iteration_s"]
    return max(wall.values(), default=0.0) / steps


def final_models_agree(records: Sequence[dict[str, Any]]) -> bool:
    """Asynchronous: every replica of each stage ends on the same global model (its last record's fingerprint)."""
    last: dict[tuple[int, int], dict[str, Any]] = {}
    for r in records:
        key = (r["stage"], r["replica"])
        if key not in last or r["step"] > last[key]["step"]:
            last[key] = r
    by_stage: dict[int, set[float]] = defaultdict(set)
    for (stage, _replica), r in last.items():
        by_stage[stage].add(r["param_sum"])
    return all(len(sums) == 1 for sums in by_stage.values())
