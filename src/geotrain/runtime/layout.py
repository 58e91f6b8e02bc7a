"""Who runs what: ranks <-> (stage, replica, shard) slots of a plan, DP groups, shard groups, pipeline neighbours.

The one place that numbers ranks. A plan of S stages x R replicas with K devices per slot (a sharded plan,
`plan --shards K`: the slot's K devices of one site hold FSDP2 shards of its stage; K = 1 otherwise) has
S x R x K ranks, stage-major, then replica, then shard:

    rank = (stage x R + replica) x K + shard

so the ranks of one slot are contiguous (its shard group), K = 1 gives the unsharded numbering (stage x R +
replica: the ranks of one stage are contiguous and form that stage's data-parallel group), and `geotrain emulate
--plan` numbers a sharded plan's ranks alike (cli/device_args.py). A stage's data-parallel group for shard k is
the same shard's peers across the replicas (the outer sync runs per shard); pipeline neighbours hold the same
shard of the previous / next stage (rank -+ R x K).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geotrain.errors import GeotrainError


class LayoutError(GeotrainError, ValueError):
    """A plan cannot be laid out on these ranks or this model."""


@dataclass(frozen=True)
class Slot:
    """One worker: its rank, the (stage, replica) it runs, the cluster device it emulates and which of the slot's
    K shards it holds (0 without shards)."""

    rank: int
    stage: int
    replica: int
    device: int
    shard: int = 0


@dataclass(frozen=True, eq=False)
class Layout:
    """An (S, R) assignment of cluster devices, as ranks 0 .. S*R*K-1; `shards`: the (S, R, K) devices of a
    sharded plan (slot (s, r) is shards[s, r, :], its first device assignment[s, r]), None for K = 1."""

    assignment: np.ndarray
    shards: np.ndarray | None = None

    def __post_init__(self) -> None:
        array = np.array(self.assignment, dtype=np.int64)
        if array.ndim != 2 or array.size == 0:
            raise LayoutError(f"assignment must be a non-empty (stages, replicas) array, got shape {array.shape}")
        array.setflags(write=False)
        object.__setattr__(self, "assignment", array)
        if self.shards is None:
            return
        devices = np.array(self.shards, dtype=np.int64)
        if devices.ndim != 3 or devices.shape[:2] != array.shape or devices.shape[2] < 1:
            raise LayoutError(f"shards must be a (stages, replicas, K) array of devices for assignment of shape "
                              f"{array.shape}, got shape {devices.shape}")
        if not np.array_equal(devices[:, :, 0], array):
            raise LayoutError("shards: every slot's first device must be its device in the assignment")
        devices.setflags(write=False)
        object.__setattr__(self, "shards", devices if devices.shape[2] > 1 else None)

    @property
    def stages(self) -> int:
        return int(self.assignment.shape[0])

    @property
    def replicas(self) -> int:
        return int(self.assignment.shape[1])

    @property
    def k(self) -> int:
        """Devices (FSDP2 shards) per (stage, replica) slot; 1 without shards."""
        return 1 if self.shards is None else int(self.shards.shape[2])

    @property
    def devices(self) -> np.ndarray:
        """(S, R, K) devices of every slot (K = 1: the assignment)."""
        return self.assignment[..., None] if self.shards is None else self.shards

    @property
    def world_size(self) -> int:
        return self.stages * self.replicas * self.k

    def rank_of(self, stage: int, replica: int, shard: int = 0) -> int:
        return (stage * self.replicas + replica) * self.k + shard

    def slot(self, rank: int) -> Slot:
        if not 0 <= rank < self.world_size:
            shards = f" x {self.k} shards" if self.k > 1 else ""
            raise LayoutError(f"rank {rank} outside 0..{self.world_size - 1} ({self.stages} stages x {self.replicas} "
                              f"replicas{shards})")
        slot, shard = divmod(rank, self.k)
        stage, replica = divmod(slot, self.replicas)
        return Slot(rank, stage, replica, int(self.devices[stage, replica, shard]), shard)

    def rank_devices(self) -> list[int]:
        """The cluster device of every rank, by rank."""
        return [int(d) for d in self.devices.reshape(-1)]

    def dp_group_ranks(self, stage: int, shard: int = 0) -> list[int]:
        """Ranks holding `shard` of `stage` in each replica (that shard's data-parallel group), by replica."""
        return [self.rank_of(stage, r, shard) for r in range(self.replicas)]

    def dp_group_devices(self, stage: int, shard: int = 0) -> list[int]:
        return [int(d) for d in self.devices[stage, :, shard]]

    def shard_group_ranks(self, stage: int, replica: int) -> list[int]:
        """The K ranks of slot (stage, replica), by shard: the FSDP2 group inside one site."""
        return [self.rank_of(stage, replica, k) for k in range(self.k)]

    def prev_rank(self, rank: int) -> int | None:
        """The rank holding the same shard of the previous stage of the same replica, None for stage 0."""
        slot = self.slot(rank)
        return None if slot.stage == 0 else self.rank_of(slot.stage - 1, slot.replica, slot.shard)

    def next_rank(self, rank: int) -> int | None:
        """The rank holding the same shard of the next stage of the same replica, None for the last stage."""
        slot = self.slot(rank)
        return None if slot.stage == self.stages - 1 else self.rank_of(slot.stage + 1, slot.replica, slot.shard)

    def describe(self, rank: int, device_names: tuple[str, ...] | None = None) -> str:
        """'rank 5 (stage 1, replica 1, device 3 region0-3)' for messages ('..., shard 1, device ...' when sharded)."""
        slot = self.slot(rank)
        device = f"device {slot.device}" + (f" {device_names[slot.device]}" if device_names else "")
        shard = f", shard {slot.shard}" if self.k > 1 else ""
        return f"rank {rank} (stage {slot.stage}, replica {slot.replica}{shard}, {device})"
