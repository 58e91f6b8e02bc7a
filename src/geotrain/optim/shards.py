"""Sharded parameters (FSDP2 / DTensor) in the outer sync: the one helper through which every outer-sync path
reads or writes a parameter, and the check that the sync's group holds same-shard peers.

`local_shard(p)` is a DTensor's local shard (`to_local()`, a view of the parameter's own memory: writing it writes
the parameter) and any other tensor itself. The outer sync (geotrain.optim.outer.OuterStep, geotrain.sync.streaming,
geotrain.sync.adaptive) keeps its anchors, outer momentum, shadows and codec residuals at the local shard's shape, so
nothing holds a full copy of the model, and the exchange averages each shard with its peers on the group given
(a device mesh's replicate dimension: `mesh["replicate"].get_group()`). It asks for the local shard at each use
rather than keeping it: FSDP2 may re-point a parameter's local tensor at its lazy initialisation (first forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def is_sharded(tensor: torch.Tensor) -> bool:
    """True for a DTensor (an FSDP2 parameter, or any tensor of torch.distributed.tensor)."""
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` this rank holds (detached): a DTensor's local shard, else the tensor itself."""
    if is_sharded(tensor):
        return tensor.to_local().detach()  # type: ignore[attr-defined]
    return tensor.detach()


def shard_peer_problem(named_params: Sequence[tuple[str, torch.Tensor]], group: Any) -> str | None:
    """Why process group `group` (None: the default one) cannot average `named_params`' shards, or None: every
    DTensor parameter's mesh must meet the group in this rank alone (the group's other members hold the same
    shard elsewhere: the mesh's replicate dimension), and plain and sharded parameters may mix."""
    import torch.distributed as dist

    me = dist.get_rank()
    members = set(dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size()))
    for name, p in named_params:
        if not is_sharded(p):
            continue
        mesh_ranks = set(p.device_mesh.mesh.flatten().tolist())  # type: ignore[attr-defined]
        shared = sorted((mesh_ranks & members) - {me})
        if shared:
            return (f"parameter {name!r} is sharded over ranks {sorted(mesh_ranks)}, and ranks {shared} of them are "
                    f"in the outer sync's group {sorted(members)}: give the group of same-shard peers (a device "
                    f"mesh's replicate dimension, mesh['replicate'].get_group()) and shard on the other dimension")
    return None
