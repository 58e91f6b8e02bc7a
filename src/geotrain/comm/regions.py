"""Regions of a data-parallel group: which global ranks share fast links, and who owns which shard.

A `Regions` is a partition of a group's global ranks into regions (lists of ranks, in order). The
hierarchical reducer cuts a flat vector into `shards = max region size` shards; in region r, shard i
is owned by member `i mod len(region r)` (so every member of the largest regions owns one shard and
members of smaller regions own several), and the owners of shard i (one per region) form its
inter-region group.

Text form (`parse_regions` / `format_regions`): regions separated by `|` or `;`, ranks by `,`, e.g.
"0,1,2,3|4,5,6,7". `regions_of_devices` builds them from a cluster's region of each rank's device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from geotrain.errors import GeotrainError, shown


class RegionsError(GeotrainError, ValueError):
    """Bad region partition: empty region, repeated or negative rank, unparsable text."""


@dataclass(frozen=True)
class Regions:
    """Global ranks per region (each region non-empty, every rank once). Build with `Regions.of`."""

    members: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, lists: Sequence[Sequence[int]], source: str = "regions") -> Regions:
        """Checked regions from lists of global ranks; RegionsError names `source` and the bad value."""
        if isinstance(lists, (str, bytes)) or not isinstance(lists, Sequence) or not lists:
            raise RegionsError(f"{source}: must be a non-empty list of regions (lists of ranks), got {shown(lists)}")
        members, seen = [], set()
        for index, region in enumerate(lists):
            if isinstance(region, (str, bytes)) or not isinstance(region, Sequence) or not region:
                raise RegionsError(f"{source}[{index}]: must be a non-empty list of ranks, got {shown(region)}")
            ranks = []
            for rank in region:
                if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                    raise RegionsError(f"{source}[{index}]: ranks must be integers >= 0, got {shown(rank)}")
                if rank in seen:
                    raise RegionsError(f"{source}[{index}]: rank {rank} appears twice")
                seen.add(rank)
                ranks.append(int(rank))
            members.append(tuple(ranks))
        return cls(tuple(members))

    @property
    def count(self) -> int:
        """Number of regions."""
        return len(self.members)

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every global rank, region by region."""
        return tuple(rank for region in self.members for rank in region)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def shards(self) -> int:
        """Shards of the vector: the size of the largest region."""
        return max(len(region) for region in self.members)

    @cached_property
    def _region_index(self) -> dict[int, int]:
        return {rank: r for r, region in enumerate(self.members) for rank in region}

    def region_of(self, rank: int) -> int:
        """Index of the region holding global `rank` (RegionsError if none does)."""
        if rank not in self._region_index:
            raise RegionsError(f"rank {rank} is in none of the regions {format_regions(self)!r:.80}")
        return self._region_index[rank]

    def owner(self, region: int, shard: int) -> int:
        """Global rank that owns `shard` in `region`."""
        members = self.members[region]
        return members[shard % len(members)]

    def owned_shards(self, rank: int, shards: int | None = None) -> tuple[int, ...]:
        """Shards (of `shards`, default `self.shards`) that `rank` owns in its region, ascending."""
        region = self.region_of(rank)
        count = self.shards if shards is None else shards
        return tuple(i for i in range(count) if self.owner(region, i) == rank)

    def inter_group(self, shard: int) -> tuple[int, ...]:
        """The owners of `shard`, one per region, in region order."""
        return tuple(self.owner(r, shard) for r in range(self.count))


def parse_regions(text: str, source: str = "--regions") -> Regions:
    """Regions from text such as "0,1|2,3" (or "0,1;2,3"); RegionsError names `source` and the text."""
    if not isinstance(text, str) or not text.strip():
        raise RegionsError(f"{source}: expected regions such as '0,1|2,3', got {shown(text)}")
    lists = []
    for part in text.replace(";", "|").split("|"):
        try:
            lists.append([int(item) for item in part.split(",") if item.strip()])
        except ValueError:
            raise RegionsError(f"{source}: ranks must be integers, got region {shown(part.strip())} "
                               f"in {shown(text)}") from None
    return Regions.of(lists, source)


def format_regions(regions: Regions) -> str:
    """The text form that `parse_regions` reads back."""
    return "|".join(",".join(str(rank) for rank in region) for region in regions.members)


def regions_of_devices(ranks: Sequence[int], devices: Sequence[int], region_of_device: Sequence[int]) -> Regions:
    """Regions of a group whose global rank ranks[i] runs on device devices[i]; `region_of_device`
    (a cluster's `region_of`) gives each device's region. Regions appear in the order of their first
    rank; inside a region, ranks keep their order."""
    if len(ranks) != len(devices):
        raise RegionsError(f"regions_of_devices: {len(ranks)} ranks but {len(devices)} devices")
    grouped: dict[int, list[int]] = {}
    for rank, device in zip(ranks, devices, strict=True):
        grouped.setdefault(int(region_of_device[device]), []).append(int(rank))
    return Regions.of(list(grouped.values()), "regions of the group's devices")
