"""The hierarchical exchange of an elastic run (--elastic --dp-hierarchical) over one torchft quorum.

torchft gives a quorum one flat process group. Its members are known at each quorum: torchft's process group
is configured with the global ranks of the quorum's replica groups in quorum rank order (group g's process of
group rank s has global rank g x group_world_size + s), and each group's region is its device's region in the
cluster. So every member builds the same `Regions` of quorum ranks (`quorum_regions`), and the hierarchical
reducer of geotrain.comm.hierarchical runs on it unchanged (the same shards, owners, codec pieces and fixed
summation orders as a non-elastic run's), its three exchanges carried point to point on the flat group by a
`QuorumWire` instead of collectives on region groups that the quorum does not have:
  1. inside each region, every member sends each owner that owner's shards (and its weight, below);
  2. the owners of each shard, one per region, send each other their encoded payload (R - 1 messages each:
     the bytes of the non-elastic ring all-gather), each followed by its region's summed weight (4 bytes);
  3. inside each region, every owner sends its shards' means to the other members.
Only step 2 crosses regions. A message that fails (a peer died, links cut) is reported to the Manager and the
exchange retries on the next quorum, as the flat exchange does (geotrain.sync.elastic); every other message of
the try is still sent and waited for, so that no live member waits out its timeout for one that gave up.

Weights: as in the flat exchange, each group sends its gradient times its weight (0 for a group that healed
into this quorum with --sync-every) and the quorum's contributors are the weights' sum: each region sums its
members' weights in step 1 (a float64 message inside the region) and the owners add the regions' sums in
region order in step 2. The mean over all n members is rescaled by n / contributors.

Error feedback (`QuorumHierarchy`): the residuals sit with a shard's owner, and a new quorum may cut the vector
into other shards and hand them to other owners. So a group keeps its residuals as one dense vector (`carry`,
zero where it owns nothing) and, before each try, loads the pieces it owns in this quorum into the reducer and
adds the rest (times n, as the owner divides the region sum by n) to its own input: whoever owns those values
now encodes them, once, with its own feedback. After a committed try the carry is what the reducer kept; a
try that fails leaves it as it was. The carry is this group's own (never in a state handed to a peer: a group
that leaves takes its undelivered part with it, at most one encoding's error, as in the flat exchange).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.codecs import CodecSpec
from geotrain.comm.hierarchical import HierarchicalGroups, HierarchicalReducer
from geotrain.comm.regions import Regions
from geotrain.sync.base import SyncError

SCATTER_TAG, WEIGHT_TAG, GATHER_TAG, OWNERS_TAG = 1, 2, 3, 16
"""Point-to-point tags of the three steps (the owners': OWNERS_TAG + shard, as a pair may share shards)."""


def quorum_groups(pg: Any, group_world_size: int) -> tuple[int, ...]:
    """The replica group of each quorum rank of torchft's process group `pg` (configured by the Manager's last
    quorum with the quorum's global ranks: group x group_world_size + group rank)."""
    ranks = getattr(pg, "_global_ranks", None)
    if not ranks:
        raise SyncError("elastic hierarchical exchange: torchft's process group holds no quorum ranks (configure "
                        "the quorum first)")
    return tuple(int(rank) // group_world_size for rank in ranks)


def quorum_regions(groups: Sequence[int], region_of_group: Callable[[int], int]) -> Regions:
    """The regions of a quorum whose rank q is replica group groups[q]: quorum ranks by their group's region,
    regions in the order of their first member."""
    grouped: dict[int, list[int]] = {}
    for rank, group in enumerate(groups):
        grouped.setdefault(int(region_of_group(group)), []).append(rank)
    return Regions.of(list(grouped.values()), "regions of the quorum's replica groups")


class QuorumWire:
    """The reducer's exchanges (geotrain.comm.hierarchical.GroupWire's methods) point to point on the quorum's
    flat process group `pg`, for quorum rank `rank` in `regions`, with this group's `weight`; `report(error)`: a
    message failed (module doc); `pause()` is entered around each step's messages. `contributors`: the quorum's
    summed weight once the exchange ran; `inter_bytes`: the bytes this rank sent to other regions (payloads and
    their weights)."""

    def __init__(self, pg: Any, regions: Regions, rank: int, weight: float, report: Callable[[Exception], None],
                 pause: Callable[[], Any]) -> None:
        self.pg, self.regions, self.rank, self.report, self.pause = pg, regions, rank, report, pause
        self.members = regions.members[regions.region_of(rank)]
        self.region_weight = float(weight)
        self.contributors = float(weight) if regions.count == 1 else 0.0
        self.weight = float(weight)
        self.inter_bytes = 0

    def _exchange(self, messages: list[tuple[int, torch.Tensor, torch.Tensor]], tag: int) -> None:
        """Send each (peer, sent, received)'s `sent` to its peer and receive into `received`, all posted first;
        each failure reported, the other messages still sent and received."""
        posts = [lambda peer=peer, sent=sent: self.pg.send([sent.contiguous()], peer, tag)
                 for peer, sent, _ in messages]
        posts += [lambda peer=peer, received=received: self.pg.recv([received], peer, tag)
                  for peer, _, received in messages]
        with self.pause():
            works = []
            for post in posts:
                try:
                    works.append(post())
                except Exception as exc:  # noqa: BLE001 - any transport error fails the try, not the process
                    self.report(exc)
            for work in works:
                try:
                    work.wait()
                except Exception as exc:  # noqa: BLE001
                    self.report(exc)

    def _region_all_to_all(self, received: torch.Tensor, send: torch.Tensor, output_splits: list[int],
                           input_splits: list[int], tag: int) -> None:
        outs = list(received.split(output_splits))
        ins = list(send.split(input_splits))
        messages = []
        for member, out, sent in zip(self.members, outs, ins, strict=True):
            if member == self.rank:
                out.copy_(sent)
            else:
                messages.append((member, sent, out))
        self._exchange(messages, tag)

    def region_scatter(self, region: int, received: torch.Tensor, send: torch.Tensor, output_splits: list[int],
                       input_splits: list[int]) -> None:
        """Step 1, and the members' weights summed in member order (float64)."""
        self._region_all_to_all(received, send, output_splits, input_splits, SCATTER_TAG)
        mine = torch.tensor([self.weight], dtype=torch.float64)
        theirs = {m: torch.zeros(1, dtype=torch.float64) for m in self.members if m != self.rank}
        self._exchange([(m, mine, theirs[m]) for m in theirs], WEIGHT_TAG)
        self.region_weight = float(sum(float(theirs[m][0]) if m in theirs else self.weight for m in self.members))
        if self.regions.count == 1:
            self.contributors = self.region_weight

    def region_gather(self, region: int, received: torch.Tensor, send: torch.Tensor, output_splits: list[int],
                      input_splits: list[int]) -> None:
        """Step 3."""
        self._region_all_to_all(received, send, output_splits, input_splits, GATHER_TAG)

    def owners_gather(self, owners: tuple[int, ...], gathered: torch.Tensor, packed: torch.Tensor) -> None:
        """Step 2 for the shard these `owners` hold: each owner's payload and its region's weight (float32)."""
        shard = next(s for s in range(self.regions.shards) if self.regions.inter_group(s) == owners)
        weight = torch.tensor([self.region_weight], dtype=torch.float32).view(torch.uint8)
        mine = torch.cat([packed.reshape(-1), weight])
        rows = torch.zeros(len(owners), mine.numel(), dtype=torch.uint8)
        rows[owners.index(self.rank)] = mine
        self._exchange([(owner, mine, rows[i]) for i, owner in enumerate(owners) if owner != self.rank],
                       OWNERS_TAG + shard)
        self.inter_bytes += (len(owners) - 1) * mine.numel()
        gathered.view(len(owners), -1).copy_(rows[:, :packed.numel()])
        self.contributors = float(sum(float(w) for w in rows[:, packed.numel():].contiguous().view(torch.float32)))


class QuorumHierarchy:
    """The hierarchical reduction of one part's gradients (`shapes`) over a quorum, with `spec`'s codec between
    regions (an uncompressed spec: fp32) and error feedback if `error_feedback`; `region_of_group`: a replica
    group's region. `residuals`: [{"carry": the dense residual}] (or [{}]: zero), replaced, never changed in place,
    so that the exchange can keep a copy across a try (geotrain.sync.elastic)."""

    def __init__(self, spec: CodecSpec, error_feedback: bool, shapes: Sequence[torch.Size],
                 region_of_group: Callable[[int], int], group_world_size: int = 1) -> None:
        self.spec, self.error_feedback = spec, error_feedback
        self.codec = spec.build()
        self.segments = [int(torch.Size(shape).numel()) for shape in shapes]
        self.region_of_group = region_of_group
        self.group_world_size = group_world_size
        self.residuals: list[dict[str, torch.Tensor]] = [{}]
        self.last_bytes = (0, 0)
        """(intra, inter) bytes this rank sent in the last try."""

    def regions(self, pg: Any) -> Regions:
        """The quorum's regions (quorum ranks), read from torchft's process group `pg`."""
        return quorum_regions(quorum_groups(pg, self.group_world_size), self.region_of_group)

    def reduce(self, flat: torch.Tensor, wire: QuorumWire, step: int) -> torch.Tensor:
        """The mean over the quorum's n members of every member's `flat` (float32, already weighted), through
        `wire`; `residuals` hold what the reducer kept (module doc)."""
        numel = flat.numel()
        reducer = HierarchicalReducer(self.codec, HierarchicalGroups.plan(wire.regions), rank=wire.rank,
                                      error_feedback=self.error_feedback, segments=self.segments, wire=wire)
        pieces = reducer.owned_pieces(numel)
        carry = self.residuals[0].get("carry")
        if carry is not None:
            outside = carry.clone()
            kept = {}
            for key, (lo, hi) in pieces.items():
                kept[key] = carry[lo:hi].clone()
                outside[lo:hi] = 0
            if reducer.feedback is not None:
                reducer.feedback.load_state_dict({"codec": self.codec.name, "residuals": kept})
            flat = flat + outside * wire.regions.world_size
        mean = reducer.all_reduce_mean(flat, step)
        self.last_bytes = (reducer.last_bytes.intra_bytes, wire.inter_bytes)
        if reducer.feedback is not None:
            carry = torch.zeros(numel, dtype=torch.float32)
            for key, (lo, hi) in pieces.items():
                if key in reducer.feedback and reducer.feedback[key].residual is not None:
                    carry[lo:hi] = reducer.feedback[key].residual.reshape(-1)
            self.residuals = [{"carry": carry}]
        return mean
