"""A sharded slot's state in a checkpoint: every DTensor (the FSDP2 parameters of the stage, the inner AdamW's moments
of them) as this rank's local shard with what places it, so that a shard file holds plain tensors (read back with
torch.load(weights_only=True)) and a resume rebuilds the DTensors on this run's mesh once they are checked to fit.

A DTensor is written as {"dtensor_local": its local tensor, "shape": the global shape, "placements": e.g.
[["shard", 0]], "mesh": the mesh's shape ([K]: the slot's shards), "coordinate": this rank's place on it}. Rebuilding
needs the same mesh shape and coordinate (the same K, the same shard): another K cuts every tensor differently.
Everything else (plain tensors: the outer sync's anchors, momentum and residuals, kept at the local shard's shape;
numbers, strings) passes through unchanged, and a state without DTensors is returned as it is.
"""

from __future__ import annotations

from typing import Any

import torch

from geotrain.optim.shards import is_sharded

LOCAL = "dtensor_local"
"""The key that marks a DTensor's record in a saved state."""


def _placement(placement: Any) -> list[Any]:
    from torch.distributed.tensor import Replicate, Shard

    if type(placement) is Shard:
        return ["shard", int(placement.dim)]
    if type(placement) is Replicate:
        return ["replicate"]
    raise ValueError(f"cannot checkpoint a DTensor placed {placement!r} (only Shard(dim) and Replicate())")


def _placements(saved: list[Any]) -> tuple[Any, ...]:
    from torch.distributed.tensor import Replicate, Shard

    return tuple(Shard(int(p[1])) if p[0] == "shard" else Replicate() for p in saved)


def local_state(state: Any) -> Any:
    """`state` (nested dicts, lists, tuples) with every DTensor replaced by its record (module doc); the same
    object where nothing inside is a DTensor."""
    if is_sharded(state):
        mesh = state.device_mesh  # type: ignore[attr-defined]
        return {LOCAL: state.to_local().detach().clone(), "shape": list(state.shape),  # type: ignore[attr-defined]
                "placements": [_placement(p) for p in state.placements],  # type: ignore[attr-defined]
                "mesh": list(mesh.shape), "coordinate": list(mesh.get_coordinate() or [])}
    if isinstance(state, dict):
        items = {key: local_state(value) for key, value in state.items()}
        return state if all(items[key] is state[key] for key in state) else items
    if isinstance(state, list | tuple):
        values = [local_state(value) for value in state]
        return state if all(a is b for a, b in zip(values, state, strict=True)) else type(state)(values)
    return state


def sharded_state(saved: Any, mesh: Any) -> Any:
    """`saved` (local_state's output) with every record rebuilt as a DTensor on `mesh` (this slot's 1-D device
    mesh; None: the run is not sharded). ValueError (one line) for a record that does not fit: an unsharded run,
    another mesh shape (another K) or another coordinate (another shard's file)."""
    if isinstance(saved, dict) and LOCAL in saved:
        return _rebuilt(saved, mesh)
    if isinstance(saved, dict):
        return {key: sharded_state(value, mesh) for key, value in saved.items()}
    if isinstance(saved, list | tuple):
        return type(saved)(sharded_state(value, mesh) for value in saved)
    return saved


def _rebuilt(record: dict[str, Any], mesh: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if mesh is None:
        raise ValueError(f"the checkpoint holds FSDP2 shards on a mesh of {record['mesh']} ranks; this run's slots "
                         "are not sharded")
    if list(mesh.shape) != list(record["mesh"]):
        raise ValueError(f"the checkpoint's shards are cut for a mesh of {record['mesh']} ranks, this slot's mesh is "
                         f"{list(mesh.shape)}")
    here = list(mesh.get_coordinate() or [])
    if here != list(record["coordinate"]):
        raise ValueError(f"the saved shard is coordinate {record['coordinate']} of its mesh, this rank holds {here}")
    shape = torch.Size(record["shape"])
    stride = torch.empty(shape, device="meta").stride()  # FSDP2's parameters are contiguous globally
    return DTensor.from_local(record[LOCAL], mesh, _placements(record["placements"]), run_check=False, shape=shape,
                              stride=stride)
