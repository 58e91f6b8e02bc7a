"""The positions of a replica group of several processes in an elastic asynchronous run (a plan of S > 1 stages or
K > 1 shards per slot: runtime/elastic/async_group.py, Positions): where each position's tier of the global model
keeps its keys in the launcher's store, the copy versions a group votes with (elected.group_vote) and the least update
count its processes agree on in the group's own gloo group (the default process group of each of its processes,
runtime/elastic/stage.py pipeline_group). With `async-hierarchical` (runtime/elastic/async_regions.py) each position
has two tiers: its region's server (keys under position_prefix + `region<r>/`) and, while its group hosts the region's,
its link to the global model's part (under position_prefix), each tier's copies published apart (GroupPositions'
`tier`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def position_prefix(rank: int) -> str:
    """The store prefix of group rank `rank`'s position's tier (stage x K + shard): `async/` for position (0, 0), whose
    elections pick every position's host, `async/position<rank>/` for the others (which follow them)."""
    return "async/" if rank == 0 else f"async/position{rank}/"


class GroupPositions:
    """Group rank `rank` of the `size` processes of start `incarnation` of replica group `group`; `store`: the
    launcher's; `tier`: the copies' key part (`""`: the tier its groups are clients of; `"global/"`: the global
    model's, whose clients are region servers)."""

    def __init__(self, store: Any, group: int, incarnation: int, rank: int, size: int, tier: str = "") -> None:
        self.store, self.group, self.incarnation, self.rank, self.size = store, group, incarnation, rank, size
        self.tier = tier

    def _copy_key(self, rank: int) -> str:
        return f"{position_prefix(rank)}{self.tier}copy/{self.group}/{self.incarnation}"

    def publish(self, version: int) -> None:
        """Position (s, k) > (0, 0): its copy's `version` (after its join and each reply), for its group's vote."""
        if self.rank > 0:
            self.store.set(self._copy_key(self.rank), str(version))

    def versions(self) -> list[int]:
        """The copy versions the group's other positions last published (those that did: position (0, 0)'s vote)."""
        keys = [self._copy_key(rank) for rank in range(1, self.size)]
        return [int(self.store.get(key).decode()) for key in keys if self.store.check([key])]

    def complete_versions(self) -> list[int] | None:
        """The copy versions of the group's other positions, or None while one of them holds no copy (the group then
        votes without one: elected.group_vote)."""
        versions = self.versions()
        return versions if len(versions) == self.size - 1 else None

    def least(self, updates: int) -> int:
        """The least of `updates` over the group's processes (so they train the same steps, push at the same ones and
        stop as one); `updates` itself for a group of one process."""
        if self.size == 1:
            return updates
        least = torch.tensor([updates], dtype=torch.int64)
        dist.all_reduce(least, op=dist.ReduceOp.MIN)
        return int(least)
