"""Checkpoints of an elastic run (`--elastic --checkpoint-dir`): one live replica group writes the run's
state in the non-elastic runtime's format (runtime/checkpoint.py: shards, manifest, `latest`), so that
`geotrain train --resume` reads it unchanged, on the same plan or on a re-plan (runtime/replan.py).

Which group writes: after a committed step that is due (`CheckpointSection.due`: every
--checkpoint-every steps and the last; with --sync-every only steps that end an outer round, and
--checkpoint-every must be a multiple of H: rules.py), the group whose participating rank in that
step's quorum is 0. torchft numbers the members of a quorum 0..n-1, the same on every member and on
every stage of a group, so each committed quorum has exactly one writer whichever groups are alive.
A writer that dies mid-write leaves a step directory without a manifest (ignored): `latest` keeps
naming the previous checkpoint.

What it writes: one copy of the state. After a committed synchronisation the live groups hold the
same weights and optimizer state (per step: AdamW moments from the same averaged gradients; with
--sync-every the anchor and the outer momentum, while the inner AdamW moments are each group's own:
the writer's are written, as live recovery hands a recovering group its peer's). The checkpoint is
therefore the layout of ONE replica carrying the whole global batch: the run's identity with
`replicas` 1 and `batch_size` R x b (the global batch and the numerics are the run's), S shards
(rank s = stage s of the writer group; a sharded plan: S x K, rank s x K + k = that group rank's FSDP2 shards
as plain local tensors, runtime/shard_state.py), and the manifest (stage 0, once its stages' shards are in
place) records under `written_by` the elastic groups, the writer and the per-group batch. A resume
with R' replicas is then a re-plan from R = 1: every replica loads the one copy. The elastic per-step
records are not carried (another format): the resumed run's report covers its own steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime import replan
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.stage import group_position, group_size
from geotrain.runtime.shard_state import local_state, sharded_state
from geotrain.sync.base import ComputeTimer
from geotrain.sync.exchange import StageExchange


def checkpoint_identity(config: RuntimeConfig) -> dict[str, Any]:
    """The identity an elastic run's checkpoint carries: one replica holding the global batch."""
    identity = config.identity()
    return {**identity, "replicas": 1, "batch_size": config.replicas * config.schedule.batch_size}


def writes_checkpoint(participating_rank: int | None) -> bool:
    """Whether a group writes the committed step's checkpoint: it has rank 0 in the step's quorum
    (torchft's `Manager.participating_rank()`; None: not a member)."""
    return participating_rank == 0


def checkpoint_due(config: RuntimeConfig, completed: int, synced: bool, end: int | None = None) -> bool:
    """Whether a checkpoint is due after `completed` steps of a launch ending at `end` (default: the run's end;
    --stop-after's step otherwise): by the checkpoint settings, and only after a step that synchronised (every
    step; with --sync-every the end of an outer round)."""
    return synced and config.checkpoint.due(completed, config.run.steps if end is None else end)


def save_group_checkpoint(config: RuntimeConfig, group: int, rank: int, completed: int, module: torch.nn.Module,
                          sync: Any, boundaries: Sequence[int], protect: tuple[int, ...] = (),
                          weights: dict[str, Any] | None = None, exchange: dict[str, Any] | None = None,
                          last_shard: Callable[[int], bool] | None = None) -> dict[str, Any]:
    """Group rank `rank` (its stage; a sharded plan: stage x K + shard) of writer group `group`: its shard of the
    checkpoint after `completed` steps; rank 0 then the manifest and `latest` (S x K > 1: once every rank of the
    group has written its shard, a barrier on the group's own gloo group, the process's default group). `weights`,
    `exchange`: the stage's weights as local_state records and a fresh exchange's state of them (None: `module`'s own;
    given, `module` is not read: another thread may be training it); `last_shard(completed)`: whether this rank's
    shard completes the step (it then writes the manifest), in place of the barrier and rank 0 (an asynchronous run's
    positions write from their servers' threads: async_checkpoint.py). Returns what its checkpoint event records:
    the shard's `path`, its `bytes` and the save's wall `seconds`."""
    started = time.perf_counter()
    directory = config.checkpoint.checkpoint_dir
    assert directory is not None
    identity = checkpoint_identity(config)
    if exchange is None:
        exchange = fresh_exchange(config, module)
    sync.settle(ComputeTimer())  # streaming: the syncs in flight, committed when posted (geotrain.sync.elastic)
    dp = {**sync.state_dict(), "exchange": exchange}
    for fragment in dp.get("fragments", []):  # streaming: each fragment's exchange too (no residuals: a group's own)
        fragment["exchange"] = exchange
    position = group_position(config, rank)
    slot = {"rank": rank, "stage": position.stage, "replica": 0,
            **({"shard": position.shard} if position.k > 1 else {})}
    devices = [[int(config.assignment[s][group])] for s in range(config.stages)]
    if weights is None:
        weights = local_state(torch.nn.ModuleList([module]).state_dict())
    state = ckpt.shard_state(slot, devices, weights, boundaries, local_state(dp), completed, [])
    path = ckpt.save_shard(directory, completed, rank, state, identity)
    if last_shard is None and group_size(config) > 1:
        import torch.distributed as dist

        dist.barrier()
    if rank == 0 if last_shard is None else last_shard(completed):
        written_by = {"elastic_groups": config.replicas, "group": group,
                      "group_batch_size": config.schedule.batch_size}
        ckpt.write_manifest(directory, completed, identity, group_size(config), written_by)
        ckpt.prune_checkpoints(directory, config.checkpoint.keep_checkpoints, protect)  # `protect`: resumed from
    return {"path": str(path), "bytes": path.stat().st_size, "seconds": time.perf_counter() - started}


def fresh_exchange(config: RuntimeConfig, module: torch.nn.Module) -> dict[str, Any]:
    """What a checkpoint holds as the exchange of `module`'s parameters: a fresh one's state (an elastic run's exchange
    keeps none of its own)."""
    return StageExchange.fresh_state(list(module.named_parameters()), config.comm.dp_codec, config.comm.error_feedback)


def load_group_checkpoint(config: RuntimeConfig, stage: int, shard: int = 0) -> dict[str, Any]:
    """`--elastic --resume`: the verified state of stage `stage` (shard `shard` of a sharded plan) from the newest
    checkpoint of this run (an elastic run's, or a non-elastic one's of the same S, K and global batch: replica
    0's shard)."""
    directory = config.checkpoint.checkpoint_dir
    assert directory is not None
    step = ckpt.latest_step(directory)
    if step is None:
        raise ckpt.CheckpointError(f"{directory}: no complete checkpoint to resume from")
    manifest = ckpt.read_manifest(directory, step)
    replan.check_resume_identity(manifest, config.identity(), str(ckpt.step_dir(directory, step)))
    source = replan.source_slot(manifest, stage, 0, shard)
    state = ckpt.load_shard(directory, step, source["rank"], manifest, source)
    state["_step"], state["_rank"] = step, source["rank"]
    return state


def restore_group_state(state: dict[str, Any], module: torch.nn.Module, sync: Any, directory: str,
                        mesh: Any = None) -> int:
    """Load a checkpoint shard's weights and sync state (the exchange's own state, if any, is not the
    elastic exchange's: skipped) into a group's stage (`mesh`: its FSDP2 shards' device mesh, None when not
    sharded); the step it continues at. CheckpointError naming the shard when it does not fit."""
    shard = ckpt.shard_path(directory, state["_step"], state["_rank"])
    try:
        torch.nn.ModuleList([module]).load_state_dict(sharded_state(state["stage"], mesh))
        dp = sharded_state(dict(state["dp"]), mesh)
        dp["exchange"] = {}
        sync.load_state_dict(dp)
        completed = int(state["completed"])
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise ckpt.CheckpointError(f"{shard}: does not fit this elastic run's stage: {first}") from None
    if completed != state["_step"]:
        raise ckpt.CheckpointError(f"{shard}: completed is {completed}, its directory says {state['_step']}")
    return completed
