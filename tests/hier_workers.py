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
    return {"means": means, "residual": residual, "intra": reducer.bytes.intra_bytes,
            "inter": reducer.bytes.inter_bytes, "expected_intra": expected.intra_bytes * steps,
            "expected_inter": expected.inter_bytes * steps, "plain_mean": plain / world_size}
