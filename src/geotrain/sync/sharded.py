"""What the outer sync serves on sharded parameters (FSDP2 / DTensor; geotrain.optim.shards), as one table of
refusals with a reason each, and the site's agreement on adaptive local steps' step times."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.optim.shards import is_sharded, shard_peer_problem
from geotrain.sync.adaptive import Gather
from geotrain.sync.base import SyncError

SHARDED_REFUSALS: tuple[tuple[str, str, str], ...] = (
    ("fragment_bytes", "fragment_split 'bytes'", "a row cut of the global tensor falls inside another rank's "
                                                 "shard; cut by layers"),
)
"""(setting, what the user set, why the sync cannot serve it with sharded parameters)."""


def check_sharded_settings(named_params: Sequence[tuple[str, torch.Tensor]], group: Any, *, fragments: int,
                           fragment_split: str) -> Any:
    """None if no parameter is sharded; else SyncError (one line) for a setting of SHARDED_REFUSALS or a group
    that is not of same-shard peers (geotrain.optim.shards.shard_peer_problem), and the process group of the
    parameters' mesh (a site's shards: where adaptive local steps agree on step times)."""
    sharded = [p for _, p in named_params if is_sharded(p)]
    if not sharded:
        return None
    on = {"fragment_bytes": fragment_split == "bytes" and fragments != 1}
    for key, what, why in SHARDED_REFUSALS:
        if on[key]:
            raise SyncError(f"DiLoCo on sharded parameters (DTensor) runs per shard; not with {what}: {why}")
    problem = shard_peer_problem(named_params, group)
    if problem is not None:
        raise SyncError(f"DiLoCo: {problem}")
    meshes = {tuple(p.device_mesh.mesh.flatten().tolist()): p.device_mesh  # type: ignore[attr-defined]
              for p in sharded}
    if len(meshes) != 1 or next(iter(meshes.values())).ndim != 1:
        raise SyncError("DiLoCo on sharded parameters needs them all on one 1-D mesh (the site's shard dimension), "
                        f"got {len(meshes)} meshes of {sorted({m.ndim for m in meshes.values()})} dimensions")
    return next(iter(meshes.values())).get_group()


def site_agreed(gather: Gather, site_group: Any) -> Gather:
    """`gather` of values that a site's shards first agree on: the largest over `site_group` (blocking, inside
    the site), so that every shard of a site computes the same local steps. `site_group` None: `gather`."""
    if site_group is None:
        return gather
    import torch.distributed as dist

    def agreed(mine: torch.Tensor) -> Callable[[], torch.Tensor]:
        mine = mine.clone()
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=site_group)
        return gather(mine)

    return agreed
