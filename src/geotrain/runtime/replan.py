"""Resuming a checkpoint under a re-plan: the same run on other devices, maybe fewer replicas.

A re-plan (`geotrain plan --exclude-devices ...`, docs/history/fault_tolerance.md "Re-planning") keeps the
pipeline depth S and the layer cut, re-maps the stages to live devices, and may change the DP degree
R. What must match the checkpoint is the run's identity (RuntimeConfig.identity: model, data,
numerics) with the per-replica batch and R replaced by the **global batch** (per-replica batch x R):
step t then trains on the same global windows (a function of the data seed, t and the global batch,
geotrain.data.replica_batch), cut into R' slices instead of R. A different S would need the layers
re-split from the checkpoint's stage shards: not supported, refused in one line naming both S.

Which shard a slot loads: stage s of new replica r takes the shard of (s, r mod R_old). The replicas
of a stage hold the same weights and optimizer state after every synchronised step, so any of them
serves; per-replica state (error-feedback residuals of a lossy DP codec, DiLoCo's inner progress
since the last outer step) of the old replicas r >= R' is dropped, and a new replica r >= R_old starts
from a copy of replica r mod R_old's.
"""

from __future__ import annotations

from typing import Any

from geotrain.runtime.checkpoint import CheckpointError, check_identity

LAYOUT_KEYS = ("replicas", "batch_size")
"""Identity keys a re-plan may change while their product, the global batch, stays."""


def global_batch(identity: dict[str, Any]) -> int | None:
    """Sequences per step over all replicas (None when the identity lacks the sizes)."""
    replicas, per_replica = identity.get("replicas"), identity.get("batch_size")
    if not isinstance(replicas, int) or not isinstance(per_replica, int):
        return None
    return replicas * per_replica


def layout_free(identity: dict[str, Any]) -> dict[str, Any]:
    """The identity with R and the per-replica batch replaced by the global batch."""
    return {**{k: v for k, v in identity.items() if k not in LAYOUT_KEYS}, "global_batch": global_batch(identity)}


def check_resume_identity(manifest: dict[str, Any], identity: dict[str, Any], source: str) -> None:
    """Refuse a checkpoint this run (`identity`, the same plan or a re-plan) cannot continue:
    another S, another K (devices per slot of a sharded plan), another global batch (naming the --batch-size
    that keeps it) or another run."""
    saved = manifest.get("identity", {})
    if saved.get("stages") != identity.get("stages"):
        raise CheckpointError(f"{source}: the checkpoint has S = {saved.get('stages')} pipeline stages, this plan "
                              f"S = {identity.get('stages')}: a re-plan must keep S (re-splitting the layers from a "
                              f"checkpoint is not supported; re-plan with --stages {saved.get('stages')})")
    if saved.get("shards", 1) != identity.get("shards", 1):
        raise CheckpointError(f"{source}: the checkpoint has K = {saved.get('shards', 1)} devices per slot (FSDP2 "
                              f"shards), this plan K = {identity.get('shards', 1)}: its shards are cut for its K "
                              f"(resume with a plan of K = {saved.get('shards', 1)}, plan --shards)")
    before, now = global_batch(saved), global_batch(identity)
    if before != now and before is not None and now is not None:
        replicas = identity["replicas"]
        fix = (f"pass --batch-size {before // replicas}" if before % replicas == 0
               else f"{before} does not split over {replicas} replicas: re-plan with a replica count dividing it")
        raise CheckpointError(f"{source}: the checkpoint's global batch is {before} sequences ({saved['replicas']} "
                              f"replicas x {saved['batch_size']}), this plan's is {now} ({replicas} x "
                              f"{identity['batch_size']}); a re-plan keeps the global batch: {fix}")
    check_identity({"identity": layout_free(saved)}, layout_free(identity), source)


def source_slot(manifest: dict[str, Any], stage: int, replica: int, shard: int = 0) -> dict[str, int]:
    """The slot header ({"rank", "stage", "replica"}, plus "shard" for a sharded checkpoint; ranks numbered as
    runtime/layout.py does) of the checkpoint shard that `shard` of slot (stage, replica) of this run loads: replica
    mod the checkpoint's R, the same shard (check_resume_identity keeps K)."""
    old_replicas, k = int(manifest["identity"]["replicas"]), int(manifest["identity"].get("shards", 1))
    old_replica = replica % old_replicas
    header = {"rank": (stage * old_replicas + old_replica) * k + shard, "stage": stage, "replica": old_replica}
    return {**header, "shard": shard} if k > 1 else header


def is_replan(manifest: dict[str, Any], shard: dict[str, Any], assignment: list[list[int]]) -> bool:
    """True when this run's layout differs from the checkpoint's: another R, or another device in some
    slot (the shard's "assignment"; shards that do not record one count as the same placement). The
    per-step records of another layout are not carried over: predictions for them would score the
    wrong devices."""
    return manifest["identity"].get("replicas") != len(assignment[0]) or shard.get("assignment", assignment) != assignment


def layout_change(manifest: dict[str, Any], shard: dict[str, Any], assignment: list[list[int]]) -> dict[str, Any] | None:
    """What a resume on `assignment` changes from the checkpoint's layout (its "replan" event), None when it
    continues on the same one: `from_replicas` (an elastic run's checkpoint: its replica groups) and
    `to_replicas`, `from_assignment` (the shard's; one elastic group's column) and `to_assignment`."""
    elastic = (manifest.get("written_by") or {}).get("elastic_groups")
    before = int(elastic if elastic is not None else manifest["identity"].get("replicas", len(assignment[0])))
    devices = shard.get("assignment", assignment)
    if before == len(assignment[0]) and (elastic is not None or devices == assignment):
        return None
    return {"from_replicas": before, "to_replicas": len(assignment[0]), "from_assignment": devices,
            "to_assignment": assignment}
