"""What an elastic run reports (`geotrain train --elastic --json`): steps, losses, validation loss,
failures, rejoins, recovery times and how far apart the replica groups' final parameters are."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch


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
    committed steps' contributing groups."""

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
    batch's token ids), contributors, params_sha256 (after each synchronisation) and emulated_s."""
    partitions: int = 0
    """Partitions the launcher cut (a group's links down, then healed)."""
    partition_recovery_s: list[float] = field(default_factory=list)
    """Per heal, seconds from the launcher healing the group's links to its rejoin (live recovery)."""
    train_emulated_s: float | None = None
    """Emulated seconds of training (the groups' emulated clock at their last step; None: links not emulated)."""

    def to_json(self) -> dict[str, Any]:
        return {"elastic": True, **asdict(self), "group_records": {str(g): r for g, r in self.group_records.items()}}


def max_param_diff(paths: list[Path]) -> float:
    """Largest absolute difference between any finished group's final parameters and the first's (0.0: equal)."""
    flats = [torch.load(path, weights_only=True) for path in paths]
    return max((float((flat - flats[0]).abs().max()) for flat in flats[1:]), default=0.0)


def read_groups(result_dir: Path, groups: int) -> dict[int, dict[str, Any]]:
    """The summaries of the groups that finished (group -> their group-<g>.json)."""
    found = {}
    for g in range(groups):
        path = result_dir / f"group-{g}.json"
        if path.is_file():
            found[g] = json.loads(path.read_text())
    return found


def mean_losses(finished: dict[int, dict[str, Any]], steps: int) -> list[float]:
    """Per step, the mean loss over the finished groups that ran it (a rejoined group lacks early steps)."""
    per_step: list[list[float]] = [[] for _ in range(steps)]
    for summary in finished.values():
        for record in summary["records"]:
            per_step[record["step"]].append(record["loss"])
    return [sum(values) / len(values) if values else float("nan") for values in per_step]


def stall_seconds(finished: dict[int, dict[str, Any]], never_failed: set[int]) -> float:
    """The longest step wall time of a finished group that never failed."""
    walls = [r["wall_s"] for g, s in finished.items() if g in never_failed for r in s["records"]]
    return max(walls, default=0.0)
