"""Worker functions for the hierarchical-reducer tests (module level: run_workers pickles them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from geotrain.codecs import get_codec
from geotrain.comm.hierarchical import HierarchicalGroups, HierarchicalReducer, expected_link_bytes
from geotrain.comm.regions import Regions


def local_vector(rank: int, step: int, numel: int) -> torch.Tensor:
    """Rank `rank`'s input at `step`: seeded normal values (any process can rebuild any rank's)."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * step + rank))


def reduce_steps(rank: int, world_size: int, lists: list[list[int]], codec: str, params: dict[str, Any],
                 steps: int, numel: int, error_feedback: bool, sharded: bool = True, intra_dtype: str = "fp32",
                 segments: list[int] | None = None) -> dict[str, Any]:
    """Run `steps` reductions; return the means, the residual sum, bytes sent and the formula's bytes."""
    regions = Regions.of(lists)
    groups = HierarchicalGroups.create(regions, sharded)
    reducer = HierarchicalReducer(get_codec(codec, **params), groups, error_feedback=error_feedback,
                                  intra_dtype=intra_dtype, segments=segments)
    means = [reducer.all_reduce_mean(local_vector(rank, step, numel), step) for step in range(steps)]
    # the same reductions posted (start_all_reduce_mean), every step's in flight before the first is finished
    posting = HierarchicalReducer(get_codec(codec, **params), groups, error_feedback=error_feedback,
                                  intra_dtype=intra_dtype, segments=segments)
    finishes = [posting.start_all_reduce_mean(local_vector(rank, step, numel), step) for step in range(steps)]
    posted = [finish() for finish in finishes]
    residual = torch.zeros(numel)
    if reducer.feedback is not None:
        from geotrain.comm.hierarchical import shard_bounds, shard_pieces
        bounds = shard_bounds(numel, groups.shards)
        for shard in regions.owned_shards(rank, groups.shards):
            lo, hi = bounds[shard]
            pieces = [(lo, hi)] if segments is None else shard_pieces(lo, hi, segments)
            for index, (a, b) in enumerate(pieces):
                if (shard, index) in reducer.feedback:
                    residual[a:b] += reducer.feedback[(shard, index)].residual
    plain = local_vector(rank, 0, numel)
    dist.all_reduce(plain)
    expected = expected_link_bytes(reducer.codec, groups, rank, numel, intra_dtype, segments)
    return {"means": means, "posted_means": posted,
            "posted_bytes": (posting.bytes.intra_bytes, posting.bytes.inter_bytes),
            "residual": residual, "intra": reducer.bytes.intra_bytes,
            "inter": reducer.bytes.inter_bytes, "expected_intra": expected.intra_bytes * steps,
            "expected_inter": expected.inter_bytes * steps, "plain_mean": plain / world_size}


def train_with_hierarchical_hook(rank: int, world_size: int, lists: list[list[int]] | None, codec: str,
                                 steps: int) -> dict[str, Any]:
    """AdamW on a 1-layer GPT, one DDP bucket, through the hierarchical hook (lists None: plain DDP).
    Returns losses, a parameter checksum vector, the hook's bytes and the formula's."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from geotrain.ddp.hierarchical_hook import register_hierarchical_hook
    from geotrain.models import GPTConfig, make_model

    config = GPTConfig(n_layer=1, d_model=32, n_head=2, context=16)
    model = make_model(config, 0)
    ddp = DistributedDataParallel(model, bucket_cap_mb=1024.0)
    state = None if lists is None else register_hierarchical_hook(ddp, codec, Regions.of(lists))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, config.vocab_size, (4, 1), generator=generator)
        tokens = (starts + torch.arange(config.context + 1)) % config.vocab_size  # learnable: next = this + 1
        loss = F.cross_entropy(ddp(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    out: dict[str, Any] = {"losses": losses, "params": flat}
    if state is not None:
        # one bucket, laid out once for the first step and once after DDP's rebuild: one reducer each
        expected_intra = expected_inter = 0
        for reducer in state.reducers.values():
            assert sorted(reducer.segments) == sorted(p.numel() for p in model.parameters())
            expected = expected_link_bytes(state.codec, state.groups, rank, flat.numel(), segments=reducer.segments)
            expected_intra += expected.intra_bytes * reducer.calls
            expected_inter += expected.inter_bytes * reducer.calls
        out.update(intra=state.bytes.intra_bytes, inter=state.bytes.inter_bytes, expected_intra=expected_intra,
                   expected_inter=expected_inter, calls=sum(r.calls for r in state.reducers.values()))
    return out


def _onebit_gradients(model: torch.nn.Module, rank: int, step: int) -> None:
    """Backward of a least-squares loss on rank `rank`'s seeded batch of `step`."""
    generator = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(16, 8, generator=generator)
    y = x[:, :4] * 0.5 - x[:, 4:] + 0.1 * torch.randn(16, 4, generator=generator)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()


def _onebit_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def region_onebit_adam(rank: int, world_size: int, lists: list[list[int]], steps: int,
                       rank_weighted: bool = False) -> dict[str, Any]:
    """RegionOneBitAdam over RegionCollective: final parameters and bytes by link class."""
    from geotrain.optim.region_collective import RegionCollective, RegionOneBitAdam

    model = _onebit_model()
    collective = RegionCollective(HierarchicalGroups.create(Regions.of(lists)), rank_weighted=rank_weighted)
    optimizer = RegionOneBitAdam(model.parameters(), lr=1e-2, warmup_steps=2, collective=collective)
    inter = []
    for step in range(steps):
        _onebit_gradients(model, rank, step)
        before = collective.bytes.inter_bytes
        optimizer.step()
        inter.append(collective.bytes.inter_bytes - before)
    return {"params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]), "inter": inter,
            "message_bytes": optimizer.layout.message_bytes, "numel": optimizer.layout.numel}


def simulated_onebit_adam(rank: int, world_size: int, lists: list[list[int]], steps: int,
                          rank_weighted: bool = False) -> torch.Tensor:
    """OneBitAdam over SimulatedCollective(R) fed with each region's mean gradient (member-order sum; rank_weighted:
    its sum x R / W, so that the mean over regions is the mean over the W ranks)."""
    from geotrain.comm import SimulatedCollective
    from geotrain.optim import OneBitAdam

    model = _onebit_model()
    optimizer = OneBitAdam(model.parameters(), lr=1e-2, warmup_steps=2, collective=SimulatedCollective(len(lists)))
    for step in range(steps):
        means = []
        for region in lists:
            grads = []
            for member in region:
                _onebit_gradients(model, member, step)
                grads.append(optimizer.flat_grad())
            total = grads[0].clone()
            for grad in grads[1:]:
                total += grad
            ranks = sum(len(members) for members in lists)
            means.append(total.div_(ranks / len(lists) if rank_weighted else len(region)))
        optimizer.step_workers(means)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
