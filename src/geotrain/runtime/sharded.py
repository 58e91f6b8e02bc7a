"""Sharded replicas in `geotrain train`: the conditions of a sharded plan that are not a pair of settings (the pairs
are runtime/composition.py's table), and the FSDP2 set-up of one slot.

A sharded plan (`plan --shards K`) makes each (stage, replica) slot K devices of one site: K ranks (runtime/layout.py
numbers them) that hold FSDP2 shards of the stage (`fully_shard` on a 1-D mesh of the slot's ranks: parameters
all-gathered and gradients reduce-scattered inside the site, every step). Each shard computes on its 1/K of the
replica's batch, so the slot's averaged gradient is the replica's; the outer sync (--sync-every H: DiLoCo, with
codecs, fragments, delay, moment sync and regions) averages each shard with the same shard of the other replicas
(geotrain.optim.shards). With pipeline stages, shard k of a stage sends its micro-batches' activations to shard k of
the next (runtime/layout.py), and each stage's slots shard that stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from geotrain.cost.shards import ShardError, check_slots
from geotrain.runtime.sections import RuntimeConfigError


def check_sharded(config: Any) -> None:
    """RuntimeConfigError (one line) for a sharded plan `config` (a RuntimeConfig) cannot run: slots of more than
    one site or devices used twice, no --sync-every (per-step data parallelism across sharded slots is not built:
    its gradients are DTensors the per-step exchanges do not take), fragments cut at equal bytes (a cut inside a
    shard), a replica's batch that does not split into K
    equal shards of whole micro-batches. Nothing for an unsharded plan."""
    layout = config.layout
    k = layout.k
    if k == 1:
        return
    try:
        check_slots(config.cluster, layout.devices, "the plan's shards.devices")
    except ShardError as exc:
        raise RuntimeConfigError(str(exc)) from None
    if config.optim.sync_every is None:
        raise RuntimeConfigError(f"a plan of {k} devices per slot (plan --shards) runs DiLoCo per shard: give "
                                 "--sync-every H (per-step data parallelism across sharded slots is not built yet)")
    if config.optim.fragments > 1 and config.optim.fragment_split == "bytes":
        raise RuntimeConfigError(f"optim.fragment_split 'bytes' with a plan of {k} devices per slot (plan --shards): "
                                 f"a row cut of a tensor falls inside another rank's shard; cut the fragments by "
                                 f"layers (--fragment-split layers)")
    unit = k * config.schedule.microbatches
    shares = config.batch_shares()
    if any(share % unit for share in shares):
        raise RuntimeConfigError(f"schedule.batch_size: each replica's {shares[0]} sequences must split into {k} "
                                 f"shards of {config.schedule.microbatches} micro-batches (a multiple of {unit})")


def shard_rows(share: int, k: int, shard: int) -> slice:
    """The rows of a replica's batch of `share` sequences that shard `shard` of `k` computes on."""
    rows = share // k
    return slice(shard * rows, (shard + 1) * rows)


def fully_shard_stage(modules: Sequence[torch.nn.Module], group: Any, device: torch.device) -> None:
    """FSDP2 on a slot's stage modules over process group `group` (the slot's K ranks, runtime/layout.py): each
    layer is its own unit (its parameters all-gathered just before it runs), then each stage module, which holds
    the rest: layers without trainable parameters, and layers sharing a parameter with another layer (tied
    embeddings: one parameter belongs to one FSDP2 unit)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, device.type)
    layers = [layer for module in modules for layer in module.layers]  # type: ignore[attr-defined]
    holders: dict[int, int] = {}
    for layer in layers:
        for p in set(layer.parameters()):
            holders[id(p)] = holders.get(id(p), 0) + 1
    for layer in layers:
        params = list(layer.parameters())
        if any(p.requires_grad for p in params) and all(holders[id(p)] == 1 for p in params):
            fully_shard(layer, mesh=mesh)
    for module in modules:
        fully_shard(module, mesh=mesh)
