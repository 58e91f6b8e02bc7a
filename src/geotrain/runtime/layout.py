"""Who runs what: ranks <-> (stage, replica) slots of a plan, DP groups, pipeline neighbours.

Rank r holds stage r // R of replica r % R (R = replicas), so the ranks of one stage are contiguous
and form that stage's data-parallel group; pipeline neighbours of a rank are rank -+ R.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geotrain.errors import GeotrainError


class LayoutError(GeotrainError, ValueError):
    """A plan cannot be laid out on these ranks or this model."""


@dataclass(frozen=True)
class Slot:
    """One worker: its rank, the (stage, replica) it runs and the cluster device it emulates."""

    rank: int
    stage: int
    replica: int
    device: int


@dataclass(frozen=True, eq=False)
class Layout:
    """An (S, R) assignment of cluster devices, as ranks 0 .. S*R-1."""

    assignment: np.ndarray

    def __post_init__(self) -> None:
        array = np.array(self.assignment, dtype=np.int64)
        if array.ndim != 2 or array.size == 0:
            raise LayoutError(f"assignment must be a non-empty (stages, replicas) array, got shape {array.shape}")
        array.setflags(write=False)
        object.__setattr__(self, "assignment", array)

    @property
    def stages(self) -> int:
        return int(self.assignment.shape[0])

    @property
    def replicas(self) -> int:
        return int(self.assignment.shape[1])

    @property
    def world_size(self) -> int:
        return self.stages * self.replicas

    def rank_of(self, stage: int, replica: int) -> int:
        return stage * self.replicas + replica

    def slot(self, rank: int) -> Slot:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} outside 0..{self.world_size - 1} ({self.stages} stages x {self.replicas} replicas)")
        stage, replica = divmod(rank, self.replicas)
        return Slot(rank, stage, replica, int(self.assignment[stage, replica]))

    def dp_group_ranks(self, stage: int) -> list[int]:
        """Ranks of the replicas of `stage` (its data-parallel group), by replica."""
        return [self.rank_of(stage, r) for r in range(self.replicas)]

    def dp_group_devices(self, stage: int) -> list[int]:
        return [int(d) for d in self.assignment[stage]]

    def prev_rank(self, rank: int) -> int | None:
        """The rank holding the previous stage of the same replica, None for stage 0."""
        slot = self.slot(rank)
        return None if slot.stage == 0 else self.rank_of(slot.stage - 1, slot.replica)

    def next_rank(self, rank: int) -> int | None:
        """The rank holding the next stage of the same replica, None for the last stage."""
        slot = self.slot(rank)
        return None if slot.stage == self.stages - 1 else self.rank_of(slot.stage + 1, slot.replica)

    def describe(self, rank: int, device_names: tuple[str, ...] | None = None) -> str:
        """'rank 5 (stage 1, replica 1, device 3 region0-3)' for messages."""
        slot = self.slot(rank)
        device = f"device {slot.device}" + (f" {device_names[slot.device]}" if device_names else "")
        return f"rank {rank} (stage {slot.stage}, replica {slot.replica}, {device})"

