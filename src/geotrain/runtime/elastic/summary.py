"""What an elastic run reports (`geotrain train --elastic --json`, in the `summary` object of the layout
every `train --json` has): steps, losses, validation loss, failures, rejoins, recovery times and how far
apart the replica groups' final parameters are (per pipeline stage, across the groups). Each stage
process of a group writes its own result files (`params_path`, `summary_path`); the launcher merges a
group's stages here."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch


FINAL_KEY = "async/final"
"""--outer-sync async*: the launcher's store key of the final global model, {"t": unix seconds its first holder got it,
"updates": its replica outer gradients} (runtime/elastic/async_group.py)."""


@dataclass(frozen=True)
class Rejoin:
    """A group that loaded a live peer's state: at training step `step`, `t` (unix seconds), the quorum
    (recovery included) taking `seconds`."""

    group: int
    step: int
    t: float
    seconds: float


@dataclass(frozen=True)
class ElasticSummary:
    """One elastic run. `losses`: per step, the mean training loss of the groups that finished (nats);
    `contributors`: per synchronised step, the replica groups whose data it averaged; `recovery_s`: per
    restart, seconds from the failure seen by the launcher to the restarted group's rejoin;
    `stall_s`: the longest step of a group that never failed (a survivor waiting for the lost peer);
    `train_s`: from the first start-up quorum to the last commit; `samples`: training sequences of the
    committed steps' contributing groups (adaptive local steps: of the inner steps they took). --outer-sync async*: `train_s` from the first group's join to the first
    holder of the final global model, `samples` those in the final global model (its `global_updates` x H x the
    batch)."""

    steps: int
    losses: list[float]
    val_loss: float | None
    replica_failures: int
    rejoins: int
    global_restarts: int
    max_param_diff_across_replicas: float
    recovery_s: list[float]
    stall_s: float
    train_s: float
    samples: int
    contributors: list[float]
    kills: int
    restarts: list[int]
    groups_finished: list[int]
    wall_s: float
    group_records: dict[int, list[dict[str, Any]]]
    """Per finished group, its records since its last start: step, loss, wall_s, batch_sum (sum of its
    batch's token ids), contributors, params_sha256 (after each synchronisation) and emulated_s; with emulated
    links sent_bytes and inter_region_bytes (--outer-sync async*: its exchanges' requests and replies, and link_s,
    their emulated seconds: runtime/elastic/links.py SocketPacing; with a partition in --chaos, cut_wait_s: the wall
    seconds its messages waited for a heal, links.CutHold; with --sync-moments the last record's moments_loaded,
    moments_sha256 of its AdamW's second moments and held_moments_sha256 of the final model's); S > 1: merged from its
    stages (`merge_stage_records`), with stage_params_sha256."""
    partitions: int = 0
    """Partitions the launcher cut (a group's links down, then healed)."""
    partition_recovery_s: list[float] = field(default_factory=list)
    """Per heal, seconds from the launcher healing the group's links to its rejoin (live recovery; --outer-sync
    async*: only a group that waited past --comm-timeout, restarted, rejoins; a shorter cut only holds its messages)."""
    train_emulated_s: float | None = None
    """Emulated seconds of training (the groups' emulated clock at their last step; None: links not emulated)."""
    elections: int = 0
    """--outer-sync async: new hosts of the global model elected after its host was lost (runtime/elastic/async_group.py)."""
    lost_updates: int = 0
    """--outer-sync async: replica outer gradients a lost host had applied beyond the elected copy (at most what was
    lost for good: their senders resent those whose reply never came)."""
    resent_updates: int = 0
    """--outer-sync async: outer gradients resent to a new host (their reply lost with the old one)."""
    global_updates: int | None = None
    """--outer-sync async*: replica outer gradients the final global model holds (None: not asynchronous)."""

    def to_json(self, config: Any) -> dict[str, Any]:
        """`train --json`'s layout (as a run that is not elastic: plan, shape, losses, a `summary` object,
        validation, config, wall_s) for this run of `config` (a RuntimeConfig); the summary holds the
        elastic facts (failures, rejoins, restarts, recoveries, ...), `group_records` each group's records."""
        facts = {k: v for k, v in asdict(self).items() if k not in ("losses", "group_records")}
        finite = [loss for loss in self.losses if math.isfinite(loss)]
        summary = {**facts, "first_loss": finite[0] if finite else None, "final_loss": finite[-1] if finite else None,
                   "replicas_in_sync": self.max_param_diff_across_replicas == 0.0}
        return {"elastic": True, "plan": config.plan_name, "stages": config.stages, "replicas": config.replicas,
                "assignment": config.assignment.tolist(), "losses": self.losses, "summary": summary,
                "validation": [] if self.val_loss is None else [{"step": self.steps, "loss": self.val_loss}],
                "config": config.to_json(), "wall_s": self.wall_s,
                "group_records": {str(g): r for g, r in self.group_records.items()}}


def params_path(result_dir: Path, group: int, stage: int) -> Path:
    """Where group rank `stage` (its stage; a sharded plan: stage x K + shard) of replica group `group` writes its
    final parameters (flat float32; a sharded plan: its shards)."""
    return result_dir / f"params-{group}-{stage}.pt"


def summary_path(result_dir: Path, group: int, stage: int) -> Path:
    """Where group rank `stage` of replica group `group` writes its summary (steps, val_loss, records)."""
    return result_dir / f"group-{group}-{stage}.json"


def max_param_diff(paths: list[Path]) -> float:
    """Largest absolute difference between any finished group's final parameters and the first's (0.0: equal)."""
    flats = [torch.load(path, weights_only=True) for path in paths]
    return max((float((flat - flats[0]).abs().max()) for flat in flats[1:]), default=0.0)


def max_stage_param_diff(result_dir: Path, groups: list[int], stages: int) -> float:
    """`max_param_diff` of each group rank across the finished `groups` (stage s against stage s; a sharded plan:
    each (stage, shard) against the same), the largest."""
    return max(max_param_diff([params_path(result_dir, g, s) for g in groups]) for s in range(stages))


LINK_BYTES = ("sent_bytes", "inter_region_bytes")
"""Record fields a group's processes each count for what they sent (emulated links): the group's is their sum."""


def merge_stage_records(per_stage: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One group's records from its stages' (S = 1: as they are): the steps every stage ran, stage 0's
    record with the last stage's loss and, with emulated links, the bytes every process of the group sent
    (LINK_BYTES summed) and the latest of their emulated clocks (`emulated_s`: each process has its own);
    after a synchronisation `params_sha256` is the sha256 of the stages' digests in stage order (equal: every
    stage bit-identical) and `stage_params_sha256` lists them."""
    if len(per_stage) == 1:
        return per_stage[0]
    # adaptive local steps: a group may train two slices of one step in a period (`slice` tells them apart)
    by_step = [{(r["step"], r.get("slice")): r for r in records} for records in per_stage]
    merged = []
    for first in per_stage[0]:
        found = [stage.get((first["step"], first.get("slice"))) for stage in by_step]
        if any(r is None for r in found):
            continue
        record = {**first, "loss": found[-1]["loss"]}
        for key in LINK_BYTES:
            if first.get(key) is not None:
                record[key] = sum(r[key] for r in found)
        if first.get("emulated_s") is not None:
            record["emulated_s"] = max(r["emulated_s"] for r in found)
        if first["synced"]:
            digests = [r["params_sha256"] for r in found]
            record["params_sha256"] = hashlib.sha256("".join(digests).encode()).hexdigest()
            record["stage_params_sha256"] = digests
        merged.append(record)
    return merged


def read_groups(result_dir: Path, groups: int, stages: int = 1) -> dict[int, dict[str, Any]]:
    """The summaries of the groups that finished, every stage of them (group -> steps, val_loss from the
    last stage, records merged by `merge_stage_records`, failed_quorums summed over the stages)."""
    found = {}
    for g in range(groups):
        paths = [summary_path(result_dir, g, s) for s in range(stages)]
        if not all(path.is_file() for path in paths):
            continue
        parts = [json.loads(path.read_text()) for path in paths]
        found[g] = {"group": g, "steps": min(p["steps"] for p in parts), "val_loss": parts[-1]["val_loss"],
                    "records": merge_stage_records([p["records"] for p in parts]),
                    "failed_quorums": sum(p["failed_quorums"] for p in parts)}
    return found


def mean_losses(finished: dict[int, dict[str, Any]], steps: int) -> list[float]:
    """Per step, the mean loss over the sequences of the finished groups that ran it (a rejoined group lacks early
    steps; with --batch-shares each group's loss weighs by its `samples`)."""
    per_step: list[list[tuple[float, int]]] = [[] for _ in range(steps)]
    for summary in finished.values():
        for record in summary["records"]:
            per_step[record["step"]].append((record["loss"], record.get("samples", 1)))
    return [sum(loss * n for loss, n in values) / sum(n for _, n in values) if values else float("nan")
            for values in per_step]


def stall_seconds(finished: dict[int, dict[str, Any]], never_failed: set[int]) -> float:
    """The longest step wall time of a finished group that never failed."""
    walls = [r["wall_s"] for g, s in finished.items() if g in never_failed for r in s["records"]]
    return max(walls, default=0.0)
