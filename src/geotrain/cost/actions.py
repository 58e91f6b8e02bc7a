"""The compute actions of a pipeline schedule, per device, read from torch.distributed.pipelining.

torch builds every schedule as per-rank lists of `_Action(stage_index, computation_type,
microbatch_index)` (its schedule IR; `_format_pipeline_order` prints it): the looped schedules
(Interleaved1F1B, LoopedBFS) run exactly that list, GPipe and 1F1B describe their hand-written loop
with it. `schedule_actions` reads those lists and keeps the compute actions, so the schedule model
(cost/schedule.py) simulates the order `geotrain train` runs (runtime/pipeline.py) instead of a
copy of it. One exception: torch 2.13's 1F1B list is wrong on the last stage (its steady state
starts at micro-batch 1, so F0 is missing) and is never run; 1F1B is therefore the loop
Schedule1F1B._step_microbatches runs: min(M, S - s) warm-up forwards, then B and F alternately
until every forward ran, then the remaining backwards.

torch is imported lazily: the communication-only models and the search never need it, and importing
it costs about a second. The lists come from torch's private `_get_pipeline_order` /
`_calculate_single_rank_operations`, called on a schedule object without stages (they read only
the stage count, micro-batch count and stages per rank); `check_actions` refuses a list that does
not run every forward and backward once, so a changed torch fails loudly, not silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from geotrain.errors import GeotrainError, shown

TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
                   "interleaved-1f1b": "ScheduleInterleaved1F1B", "looped-bfs": "ScheduleLoopedBFS"}
"""Schedule name (runtime/pipeline.py SCHEDULES) -> torch.distributed.pipelining class."""
LOOPED = ("interleaved-1f1b", "looped-bfs")


class ScheduleError(GeotrainError, ValueError):
    """An unknown pipeline schedule, an invalid micro-batch or stage count, or an order that deadlocks."""


class Action(NamedTuple):
    """One compute action: "F" (forward) or "B" (full backward) of `microbatch` at pipeline stage `stage`
    (of S x V; stage v runs on device v mod S)."""

    op: str
    stage: int
    microbatch: int


def schedule_actions(kind: str, stages: int, microbatches: int, virtual: int = 1) -> tuple[tuple[Action, ...], ...]:
    """Per device s of `stages`, its compute actions in execution order, for schedule `kind` over
    `stages` x `virtual` pipeline stages and `microbatches` micro-batches."""
    if kind not in TORCH_SCHEDULES:
        raise ScheduleError(f"unknown pipeline schedule {kind!r} (known: {', '.join(TORCH_SCHEDULES)})")
    for label, value, low in (("stages", stages, 1), ("micro-batches", microbatches, 1),
                              ("virtual stages", virtual, 2 if kind in LOOPED else 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ScheduleError(f"schedule {kind!r}: {label} must be an integer >= {low}, got {shown(value)}")
    if kind not in LOOPED and virtual != 1:
        raise ScheduleError(f"schedule {kind!r} runs one stage per device, got {virtual} virtual stages")
    if kind == "1f1b":
        actions = tuple(_one_f_one_b(rank, stages, microbatches) for rank in range(stages))
        check_actions(actions, virtual, microbatches, kind)
        return actions
    from torch.distributed.pipelining import schedules  # lazy: see the module docstring

    schedule = object.__new__(getattr(schedules, TORCH_SCHEDULES[kind]))
    schedule._n_microbatches = microbatches
    if kind in LOOPED:
        schedule._stages = [None] * virtual  # only its length is read
        schedule.n_local_stages = virtual
        schedule.pp_group_size = stages
        rounds = max(1, microbatches // stages)
        if kind == "interleaved-1f1b" and microbatches % rounds:
            raise ScheduleError(f"schedule {kind!r}: micro-batches must be a multiple of {rounds} "
                                f"(micro-batches // stages) for torch's rounds, got {microbatches}")
        schedule.microbatches_per_round = microbatches // rounds
        order = {rank: schedule._calculate_single_rank_operations(rank) for rank in range(stages)}
    else:
        schedule._num_stages = stages
        order = schedule._get_pipeline_order()
    actions = tuple(tuple(Action(str(a.computation_type.value), int(a.stage_index), int(a.microbatch_index))
                          for a in order[rank] if a is not None and a.computation_type.value in ("F", "B"))
                    for rank in range(stages))
    check_actions(actions, virtual, microbatches, kind)
    return actions


def _one_f_one_b(rank: int, stages: int, microbatches: int) -> tuple[Action, ...]:
    """What torch's Schedule1F1B runs on pipeline rank `rank` (see the module docstring)."""
    warmup = min(microbatches, stages - rank)
    ops = [Action("F", rank, m) for m in range(warmup)]
    for m in range(microbatches - warmup):
        ops += [Action("B", rank, m), Action("F", rank, warmup + m)]
    return tuple(ops + [Action("B", rank, m) for m in range(microbatches - warmup, microbatches)])


def check_actions(actions: Sequence[Sequence[Action]], virtual: int, microbatches: int, kind: str = "custom") -> None:
    """Raise ScheduleError unless device s runs F and B of every micro-batch of each of its stages
    (s, s + S, ...) exactly once, each B after its F."""
    stages = len(actions)
    for rank, ops in enumerate(actions):
        want = {(op, rank + k * stages, m) for op in "FB" for k in range(virtual) for m in range(microbatches)}
        seen: set[tuple[str, int, int]] = set()
        for op, stage, m in ops:
            if (op, stage, m) in seen or (op, stage, m) not in want or (op == "B" and ("F", stage, m) not in seen):
                raise ScheduleError(f"schedule {kind!r}: device {rank}'s order has {op}{m} of stage {stage} "
                                    f"out of place (torch's schedule IR changed?)")
            seen.add((op, stage, m))
        if seen != want:
            raise ScheduleError(f"schedule {kind!r}: device {rank}'s order misses {sorted(want - seen)[:3]}")
