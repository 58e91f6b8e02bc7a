"""1-bit Adam that compresses only between regions: regions are its workers.

    groups = HierarchicalGroups.create(regions)                  # every rank of the world
    optimizer = RegionOneBitAdam(model.parameters(), collective=RegionCollective(groups), ...)
    ...loss.backward(); optimizer.step()                          # no DDP: the optimizer communicates

`RegionOneBitAdam.flat_grad` first averages the gradient inside the rank's region at full precision
(an all-gather in the region, summed in member order), so every member of a region holds the same
gradient, momentum and residuals; OneBitAdam then runs with one worker per region over
`RegionCollective`, whose world is the regions (world_size R, local rank = this rank's region).
Its collectives carry each region's (identical) data between regions sharded over the members:
the vector is cut into S = max region size pieces; piece i travels between the owners of shard i
(geotrain.comm.regions) and the members then share their pieces inside the region (one all-to-all).
So every NIC carries a share of the inter-region traffic and the 1-bit messages cross regions once.
Regions weigh equally in the mean (as 1-bit Adam's workers), whatever their sizes; results are
bit-identical to OneBitAdam over SimulatedCollective(R) fed with the region means. With `rank_weighted=True`
a region's share is its members' sum x R / W (W ranks), so that the mean over regions is the mean over ranks,
as flat data parallelism (`geotrain train` uses it; with regions of equal size both are the same bits).

`wrap(nbytes, run)`: every collective call (the region mean and the three between regions) goes through it,
`nbytes()` telling the bytes this rank sent in the call once it ran, as TorchCollective's `wrap` (the runtime
times them: geotrain.sync.onebit). The collectives carry host copies (the groups' gloo; on CUDA beside NCCL, as
the runtime's other exchanges) and return each result on its input's device, where 1-bit Adam keeps its state.

Bytes (`bytes`, this rank): intra-region (k - 1) x 4 n for the region mean plus the piece sharing;
inter-region, per collective, the pieces of the shards it owns sent to the R - 1 other regions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from geotrain.comm.collectives import all_gather_single
from geotrain.comm.hierarchical import HierarchicalGroups, LinkBytes, shard_bounds
from geotrain.comm.ledger import CommLedger, tensor_bytes
from geotrain.optim.onebit_adam import OneBitAdam


class RegionCollective:
    """A `Collective` whose ranks are the regions of `groups` (see the module doc)."""

    def __init__(self, groups: HierarchicalGroups, rank: int | None = None, *, rank_weighted: bool = False,
                 wrap: Callable[[Callable[[], int], Callable[[], Any]], Any] | None = None) -> None:
        self.groups = groups
        self.rank_weighted = rank_weighted
        self._wrap = wrap
        self.regions = groups.regions
        self.rank = dist.get_rank() if rank is None else rank
        self.region = self.regions.region_of(self.rank)
        self.members = self.regions.members[self.region]
        self.world_size = self.regions.count
        self.local_ranks = (self.region,)
        self.ledger = CommLedger()
        self.bytes = LinkBytes()

    @property
    def sent_bytes(self) -> int:
        """Bytes this rank has sent so far, inside its region and between regions."""
        return self.bytes.intra_bytes + self.bytes.inter_bytes

    def _call(self, run: Callable[[], Any]) -> Any:
        if self._wrap is None:
            return run()
        before = self.sent_bytes
        return self._wrap(lambda: self.sent_bytes - before, run)

    def region_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """This region's share of the mean (module doc): the members' mean of `tensor` (`rank_weighted`: their sum
        x R / W), the same bits on each (member-order sum)."""
        device, tensor = tensor.device, tensor.detach().reshape(-1).to("cpu").contiguous()
        k = len(self.members)
        divisor = self.regions.world_size / self.world_size if self.rank_weighted else k
        if k == 1:
            return (tensor.clone() if divisor == 1 else tensor / divisor).to(device)
        gathered = torch.empty(k * tensor.numel(), dtype=tensor.dtype)

        def gather() -> None:
            all_gather_single(gathered, tensor, group=self.groups.intra[self.region])
            self.bytes.intra_bytes += (k - 1) * tensor_bytes(tensor)

        self._call(gather)
        copies = gathered.view(k, -1)
        total = copies[0].clone()
        for copy in copies[1:]:
            total += copy
        return total.div_(divisor).to(device)

    def _share(self, owned: dict[int, torch.Tensor], widths: list[int]) -> dict[int, torch.Tensor]:
        """Every shard's received pieces (R rows of widths[shard] each), from the owners' `owned`, on every member."""
        k = len(self.members)
        if k == 1:
            return owned
        shards = self.groups.shards
        mine = torch.cat([owned[s].reshape(-1) for s in sorted(owned)])
        sizes = [sum(self.world_size * widths[s] for s in self.regions.owned_shards(m, shards)) for m in self.members]
        received = torch.empty(sum(sizes), dtype=mine.dtype)
        dist.all_to_all_single(received, mine.repeat(k), sizes, [mine.numel()] * k,
                               group=self.groups.intra[self.region])
        self.bytes.intra_bytes += (k - 1) * tensor_bytes(mine)
        out, offset = {}, 0
        for member in self.members:
            for shard in self.regions.owned_shards(member, shards):
                size = self.world_size * widths[shard]
                out[shard] = received[offset:offset + size].view(self.world_size, -1)
                offset += size
        return out

    def _exchange(self, rows: torch.Tensor, all_to_all: bool) -> torch.Tensor:
        """`rows` (R, c): row j for region j (all_to_all) or R copies of this region's piece (all_gather).
        Returns (R, c): row r from region r."""
        c = rows.shape[1]
        bounds = shard_bounds(c, self.groups.shards)
        owned = {}
        for shard in self.regions.owned_shards(self.rank, self.groups.shards):
            lo, hi = bounds[shard]
            group = self.groups.inter[self.regions.inter_group(shard)]
            if all_to_all:
                send = rows[:, lo:hi].contiguous().reshape(-1)
                out = torch.empty_like(send)
                dist.all_to_all_single(out, send, group=group)
                self.bytes.inter_bytes += (self.world_size - 1) * (hi - lo) * rows.element_size()
            else:
                send = rows[0, lo:hi].contiguous()
                out = torch.empty(self.world_size * (hi - lo), dtype=rows.dtype)
                all_gather_single(out, send, group=group)
                self.bytes.inter_bytes += (self.world_size - 1) * tensor_bytes(send)
            owned[shard] = out.view(self.world_size, hi - lo)
        pieces = self._share(owned, [hi - lo for lo, hi in bounds])
        return torch.cat([pieces[s] for s in range(self.groups.shards)], dim=1)

    def _check(self, tensors: Sequence[torch.Tensor], what: str) -> torch.Tensor:
        """This region's one tensor, flat, in host memory."""
        if len(tensors) != 1:
            raise ValueError(f"{what}: expected one tensor (this region's), got {len(tensors)}")
        return tensors[0].detach().reshape(-1).to("cpu").contiguous()

    def all_reduce_mean(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """Mean over regions of each region's tensor (region-order sum, as SimulatedCollective)."""
        mine = self._check(tensors, "all_reduce_mean")
        self.ledger.record("all_reduce", tensor_bytes(mine), self.world_size)
        if self.world_size == 1:
            return mine.clone().view_as(tensors[0]).to(tensors[0].device)
        rows = self._call(lambda: self._exchange(mine.view(1, -1).expand(self.world_size, -1), all_to_all=False))
        total = rows[0].clone()
        for row in rows[1:]:
            total += row
        return total.div_(self.world_size).view_as(tensors[0]).to(tensors[0].device)

    def all_to_all(self, sends: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        send = self._check(sends, "all_to_all")
        if send.numel() % self.world_size:
            raise ValueError(f"all_to_all: send buffer of {send.numel()} elements is not {self.world_size} equal chunks")
        self.ledger.record("all_to_all", tensor_bytes(send), self.world_size)
        if self.world_size == 1:
            return [send.clone().to(sends[0].device)]
        return [self._call(lambda: self._exchange(send.view(self.world_size, -1), all_to_all=True)).reshape(-1)
                .to(sends[0].device)]

    def all_gather(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        mine = self._check(tensors, "all_gather")
        self.ledger.record("all_gather", tensor_bytes(mine), self.world_size)
        if self.world_size == 1:
            return mine.clone().to(tensors[0].device)
        return self._call(lambda: self._exchange(mine.view(1, -1).expand(self.world_size, -1),
                                                 all_to_all=False)).reshape(-1).to(tensors[0].device)


class RegionOneBitAdam(OneBitAdam):
    """OneBitAdam whose workers are regions: `flat_grad` is this rank's region mean (full precision)."""

    def __init__(self, params: Any, *, collective: RegionCollective, **options: Any) -> None:
        if not isinstance(collective, RegionCollective):
            raise TypeError(f"RegionOneBitAdam needs a RegionCollective, got {type(collective).__name__}")
        super().__init__(params, collective=collective, **options)

    def flat_grad(self) -> torch.Tensor:
        collective: RegionCollective = self.collective  # type: ignore[assignment]
        return collective.region_mean(super().flat_grad())
