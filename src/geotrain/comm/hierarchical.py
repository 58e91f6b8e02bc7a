"""Hierarchical compressed all-reduce: full precision inside regions, a codec only between them.

    groups = HierarchicalGroups.create(regions)          # on EVERY rank of the world (torch's new_group rule)
    reducer = HierarchicalReducer(get_codec("sign"), regions, groups)
    mean = reducer.all_reduce_mean(flat, step)           # the same bits on every member
    reducer.bytes.intra_bytes, reducer.bytes.inter_bytes # what this rank sent, per link class

Algorithm (W ranks in R regions; the flat vector of n values is cut into S shards, S = the largest
region's size, or 1 with `sharded=False`; in region r, shard i is owned by member i mod |r|):
1. intra-region reduce-scatter (one all-to-all in the region, in `intra_dtype`): every member sends
   each owner that owner's shards of its vector; the owner sums the |r| copies in member order;
2. inter-region exchange, per shard: the owner encodes (region sum / W) + its error-feedback residual
   for that shard (one residual per shard owner), the owners of shard i (one per region) all-gather
   the packed payloads and each decodes and sums them in region order -> the mean of shard i;
3. intra-region all-gather (one all-to-all, `intra_dtype`): every owner sends its shards' means to
   the other members; every member (owner included) takes the received copy.
With `segments` (e.g. parameter sizes) each shard is encoded piece by piece, one piece per segment it
overlaps, so codecs with per-tensor scales keep them. With one region, step 2 is skipped (no codec:
a plain all-reduce); regions of one member skip steps 1 and 3. Every member ends bit-identical: the
sums run in a fixed order and every member reads the result from the same exchanged bytes.

Bytes this rank sends per call (`expected_link_bytes`, held equal to `bytes` by the tests):
  intra = (sum of its shards' sizes sent to each other member in step 1 + its own shards sent to each
           other member in step 3) x itemsize(intra_dtype)
  inter = sum over its owned shards of (R - 1) x payload bytes of the shard (ring all-gather).
So all ranks together put R (R - 1) x payload(n) on inter-region links per call, against
R (W - 1) x payload(n) for a flat ring all-gather of the same codec over W ranks in R blocks.

Posted (`start_all_reduce_mean`, to overlap the exchange with compute): steps 1 and the encoding of 2 run at
once, the inter-region all-gathers are posted (async work of the owners' groups, where the wire can post:
`post_owners_gather`) and the returned function waits for them, decodes and runs step 3; `all_reduce_mean` is
the two halves back to back, so both give the same bits.

The reducer's three exchanges go through a `wire`: `GroupWire` (the default) runs them as collectives on the
groups of `HierarchicalGroups.create`; an elastic run's quorum has one flat group and carries them point to
point on it (geotrain.sync.elastic_hierarchical), with a `HierarchicalGroups.plan` that creates no group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from geotrain.codecs.base import Codec, CodecError, Payload, PayloadSpec
from geotrain.codecs.dtypes import float_dtype, itemsize
from geotrain.codecs.feedback import ErrorFeedbackBank
from geotrain.codecs.wire import pack_payload, unpack_payload
from geotrain.comm.collectives import all_gather_single
from geotrain.comm.groups import new_group
from geotrain.comm.regions import Regions, RegionsError


@dataclass
class LinkBytes:
    """Bytes one rank sent, by link class (inside its region / to other regions)."""

    intra_bytes: int = 0
    inter_bytes: int = 0

    def add(self, other: LinkBytes) -> None:
        self.intra_bytes += other.intra_bytes
        self.inter_bytes += other.inter_bytes


def shard_bounds(numel: int, shards: int) -> list[tuple[int, int]]:
    """[lo, hi) of each of `shards` contiguous shards of `numel` values (the first numel % shards get one more)."""
    base, extra = divmod(numel, shards)
    bounds, lo = [], 0
    for i in range(shards):
        hi = lo + base + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def shard_pieces(lo: int, hi: int, segments: Sequence[int]) -> list[tuple[int, int]]:
    """The non-empty [a, b) pieces of [lo, hi) cut at segment boundaries (segments: sizes in order)."""
    cuts, start = {lo, hi}, 0
    for size in segments:
        start += size
        if lo < start < hi:
            cuts.add(start)
    points = sorted(cuts)
    return [(a, b) for a, b in zip(points[:-1], points[1:]) if b > a]


@dataclass(frozen=True)
class HierarchicalGroups:
    """The process groups of a hierarchy: one per region of >= 2 members, one per distinct set of
    shard owners (None where a group is not needed). `create` on every rank of the world."""

    regions: Regions
    shards: int
    intra: tuple[Any, ...]
    inter: dict[tuple[int, ...], Any]

    @classmethod
    def create(cls, regions: Regions, sharded: bool = True, timeout_s: float | None = None) -> HierarchicalGroups:
        """Create the groups, each collective on them bounded by `timeout_s` seconds (None: torch's default);
        every process of the default group must call this, in the same order."""
        shards = regions.shards if sharded else 1
        intra = tuple(new_group(region, timeout_s) if len(region) > 1 else None for region in regions.members)
        inter: dict[tuple[int, ...], Any] = {}
        if regions.count > 1:
            for shard in range(shards):
                owners = regions.inter_group(shard)
                if owners not in inter:
                    inter[owners] = new_group(owners, timeout_s)
        return cls(regions, shards, intra, inter)

    @classmethod
    def plan(cls, regions: Regions, sharded: bool = True) -> HierarchicalGroups:
        """The hierarchy's layout without process groups (a wire that carries the exchanges itself)."""
        return cls(regions, regions.shards if sharded else 1, (None,) * regions.count, {})


class GroupWire:
    """The reducer's exchanges as collectives on the process groups of `groups` (HierarchicalGroups.create).
    `region_scatter` (step 1) and `region_gather` (step 3): an all-to-all in region `region` (torch's
    all_to_all_single arguments); `owners_gather` (step 2): the all-gather of `packed` among `owners`."""

    def __init__(self, groups: HierarchicalGroups) -> None:
        self.groups = groups

    def region_scatter(self, region: int, received: torch.Tensor, send: torch.Tensor, output_splits: list[int],
                       input_splits: list[int]) -> None:
        dist.all_to_all_single(received, send, output_splits, input_splits, group=self.groups.intra[region])

    region_gather = region_scatter

    def owners_gather(self, owners: tuple[int, ...], gathered: torch.Tensor, packed: torch.Tensor) -> None:
        all_gather_single(gathered, packed, group=self.groups.inter[owners])

    def post_owners_gather(self, owners: tuple[int, ...], gathered: torch.Tensor, packed: torch.Tensor) -> Any:
        """`owners_gather` posted (async work of the owners' group); `.wait()` completes it."""
        return all_gather_single(gathered, packed, group=self.groups.inter[owners], async_op=True)


class HierarchicalReducer:
    """Averages one flat float vector over the regions' ranks (see the module doc). Holds this rank's
    error-feedback residuals (one per owned shard and segment piece) and byte counters."""

    def __init__(self, codec: Codec, groups: HierarchicalGroups, *, error_feedback: bool = True,
                 intra_dtype: str = "fp32", segments: Sequence[int] | None = None, rank: int | None = None,
                 wire: Any = None) -> None:
        self.codec = codec
        self.groups = groups
        self.wire = GroupWire(groups) if wire is None else wire
        self.regions = groups.regions
        self.rank = dist.get_rank() if rank is None else rank
        self.region = self.regions.region_of(self.rank)
        self.members = self.regions.members[self.region]
        try:
            self.intra_dtype = float_dtype(intra_dtype, "intra_dtype")
        except CodecError as exc:
            raise RegionsError(str(exc)) from None
        self.segments = None if segments is None else [int(s) for s in segments]
        self.feedback = ErrorFeedbackBank(codec) if error_feedback else None
        self.bytes = LinkBytes()
        self.last_bytes = LinkBytes()
        self.calls = 0

    @property
    def world_size(self) -> int:
        return self.regions.world_size

    def _owned(self, member: int) -> list[int]:
        return list(self.regions.owned_shards(member, self.groups.shards))

    def all_reduce_mean(self, flat: torch.Tensor, step: int) -> torch.Tensor:
        """The element-wise mean over every rank's `flat` (1-D float, same size everywhere), as float32;
        `step` seeds codecs that draw (randk) and is the same on every rank."""
        return self.start_all_reduce_mean(flat, step)()

    def start_all_reduce_mean(self, flat: torch.Tensor, step: int) -> Callable[[], torch.Tensor]:
        """`all_reduce_mean` in two halves (module doc): steps 1 and 2's encoding now, the inter-region
        all-gathers posted; the returned function (call it once) waits, decodes, runs step 3 and returns the
        mean. Calls may overlap (each keeps its own buffers); they finish in the order they started."""
        flat = flat.detach().reshape(-1).to(torch.float32)
        if self.segments is not None and sum(self.segments) != flat.numel():
            raise RegionsError(f"segments sum to {sum(self.segments)} values, the vector has {flat.numel()}")
        sent = LinkBytes()
        bounds = shard_bounds(flat.numel(), self.groups.shards)
        sums = self._reduce_scatter(flat, bounds, sent)
        posted = {shard: self._post_inter(shard, bounds[shard][0], sums[shard] / self.world_size, step, sent)
                  for shard in sums}

        def finish() -> torch.Tensor:
            means = {shard: wait() for shard, wait in posted.items()}
            result = self._all_gather(means, bounds, flat.numel(), sent)
            self.last_bytes = sent
            self.bytes.add(sent)
            self.calls += 1
            return result

        return finish

    def _reduce_scatter(self, flat: torch.Tensor, bounds: list[tuple[int, int]],
                        sent: LinkBytes) -> dict[int, torch.Tensor]:
        """{owned shard: sum over the region's members (member order), float32}."""
        mine = self._owned(self.rank)
        if len(self.members) == 1:
            return {shard: flat[slice(*bounds[shard])].clone() for shard in mine}
        send_parts = [torch.cat([flat[slice(*bounds[s])] for s in self._owned(m)] or [flat[:0]])
                      for m in self.members]
        send = torch.cat(send_parts).to(self.intra_dtype)
        my_numel = sum(bounds[s][1] - bounds[s][0] for s in mine)
        received = torch.empty(my_numel * len(self.members), dtype=self.intra_dtype)
        self.wire.region_scatter(self.region, received, send, [my_numel] * len(self.members),
                                 [p.numel() for p in send_parts])
        sent.intra_bytes += sum(p.numel() for m, p in zip(self.members, send_parts, strict=True)
                                           if m != self.rank) * send.element_size()
        total = torch.zeros(my_numel, dtype=torch.float32)
        for copy in received.view(len(self.members), my_numel):  # member order: a fixed sum
            total += copy.to(torch.float32)
        sums, offset = {}, 0
        for shard in mine:
            size = bounds[shard][1] - bounds[shard][0]
            sums[shard] = total[offset:offset + size]
            offset += size
        return sums

    def _pieces(self, shard_numel: int, lo: int) -> list[tuple[int, int]]:
        """Pieces of a shard starting at global offset `lo`, relative to the shard."""
        if self.segments is None:
            return [(0, shard_numel)] if shard_numel else []
        return [(a - lo, b - lo) for a, b in shard_pieces(lo, lo + shard_numel, self.segments)]

    def _post_inter(self, shard: int, lo: int, value: torch.Tensor, step: int,
                    sent: LinkBytes) -> Callable[[], torch.Tensor]:
        """Step 2 for `shard` (starting at flat offset `lo`): encode with error feedback and post the all-gather
        among the shard's owners; the returned function waits, decodes and sums in region order: the mean over
        regions."""
        if self.regions.count == 1:
            return lambda: value
        self.codec.set_step(step)
        payloads = [self._encode((shard, index), value[a:b])
                    for index, (a, b) in enumerate(self._pieces(value.numel(), lo))]
        if not payloads:
            return lambda: value
        specs = [payload.spec() for payload in payloads]
        packed = torch.cat([pack_payload(payload) for payload in payloads])
        owners = self.regions.inter_group(shard)
        gathered = torch.empty(len(owners) * packed.numel(), dtype=torch.uint8)
        post = getattr(self.wire, "post_owners_gather", None)
        work = None
        if post is None:
            self.wire.owners_gather(owners, gathered, packed)
        else:
            work = post(owners, gathered, packed)
        sent.inter_bytes += (len(owners) - 1) * packed.numel()

        def mean() -> torch.Tensor:
            if work is not None:
                work.wait()
            self.codec.set_step(step)  # another call may have set it since (codecs that draw decode by it)
            total = torch.zeros(value.numel(), dtype=torch.float32)
            for region_bytes in gathered.view(len(owners), -1):  # region order: a fixed sum
                total += self._decode_pieces(region_bytes, specs, value.numel(), lo)
            return total

        return mean

    def owned_pieces(self, numel: int) -> dict[tuple[int, int], tuple[int, int]]:
        """{error-feedback key (shard, piece): its [lo, hi) in a vector of `numel` values} of the shards this rank
        owns (where its residuals are: every key `all_reduce_mean` on `numel` values encodes)."""
        if self.regions.count == 1:
            return {}
        bounds = shard_bounds(numel, self.groups.shards)
        return {(shard, index): (bounds[shard][0] + a, bounds[shard][0] + b)
                for shard in self._owned(self.rank)
                for index, (a, b) in enumerate(self._pieces(bounds[shard][1] - bounds[shard][0], bounds[shard][0]))}

    def _encode(self, key: tuple[int, int], piece: torch.Tensor) -> Payload:
        if self.feedback is None:
            return self.codec.encode(piece)
        return self.feedback.encode(key, piece)

    def _decode_pieces(self, data: torch.Tensor, specs: list[PayloadSpec], numel: int, lo: int) -> torch.Tensor:
        out = torch.empty(numel, dtype=torch.float32)
        offset = 0
        for (a, b), spec in zip(self._pieces(numel, lo), specs, strict=True):
            payload = unpack_payload(data[offset:offset + spec.nbytes], spec)
            out[a:b] = self.codec.decode(payload).reshape(-1).to(torch.float32)
            offset += spec.nbytes
        return out

    def _all_gather(self, means: dict[int, torch.Tensor], bounds: list[tuple[int, int]], numel: int,
                    sent: LinkBytes) -> torch.Tensor:
        """The full mean vector on every member: owners send their shards' means to the region."""
        result = torch.empty(numel, dtype=torch.float32)
        if len(self.members) == 1:
            for shard, mean in means.items():
                result[slice(*bounds[shard])] = mean
            return result
        mine = torch.cat([means[s] for s in sorted(means)] or [torch.zeros(0)]).to(self.intra_dtype)
        k = len(self.members)
        sizes = [sum(bounds[s][1] - bounds[s][0] for s in self._owned(m)) for m in self.members]
        received = torch.empty(sum(sizes), dtype=self.intra_dtype)
        self.wire.region_gather(self.region, received, mine.repeat(k), sizes, [mine.numel()] * k)
        sent.intra_bytes += (k - 1) * mine.numel() * mine.element_size()
        offset = 0
        for member, size in zip(self.members, sizes, strict=True):
            piece = received[offset:offset + size].to(torch.float32)
            start = 0
            for shard in self._owned(member):
                lo, hi = bounds[shard]
                result[lo:hi] = piece[start:start + hi - lo]
                start += hi - lo
            offset += size
        return result

    def state_dict(self) -> dict[str, Any]:
        """The error-feedback residuals (per owned shard and piece) and byte counters."""
        return {"feedback": None if self.feedback is None else self.feedback.state_dict(),
                "intra_bytes": self.bytes.intra_bytes, "inter_bytes": self.bytes.inter_bytes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("feedback") is None) != (self.feedback is None):
            raise RegionsError("hierarchical reducer state and run disagree on error feedback")
        if self.feedback is not None:
            self.feedback.load_state_dict(state["feedback"])
        self.bytes = LinkBytes(int(state.get("intra_bytes", 0)), int(state.get("inter_bytes", 0)))


def expected_link_bytes(codec: Codec, groups: HierarchicalGroups, rank: int, numel: int,
                        intra_dtype: str = "fp32", segments: Sequence[int] | None = None) -> LinkBytes:
    """What `HierarchicalReducer.all_reduce_mean` on `numel` values sends from `rank`, by the formula of
    the module doc and the codec's documented `wire_nbytes` (no communication)."""
    regions, shards = groups.regions, groups.shards
    region = regions.members[regions.region_of(rank)]
    bounds = shard_bounds(numel, shards)
    size = itemsize(float_dtype(intra_dtype, "intra_dtype"))

    def owned_numel(member: int) -> int:
        return sum(bounds[s][1] - bounds[s][0] for s in regions.owned_shards(member, shards))

    out = LinkBytes()
    if len(region) > 1:
        out.intra_bytes = size * (sum(owned_numel(m) for m in region if m != rank)
                                      + (len(region) - 1) * owned_numel(rank))
    if regions.count > 1:
        for shard in regions.owned_shards(rank, shards):
            lo, hi = bounds[shard]
            pieces = [(lo, hi)] if segments is None else shard_pieces(lo, hi, segments)
            out.inter_bytes += (regions.count - 1) * sum(codec.wire_nbytes((b - a,)) for a, b in pieces if b > a)
    return out
