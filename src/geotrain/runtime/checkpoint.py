"""Sharded checkpoints, written atomically: every rank its own shard, rank 0 the manifest last.

Layout under the checkpoint directory D:

    D/step-000012/rank-0003.pt      one per rank: model shard, optimizer, codec residuals, RNG, records
    D/step-000012/manifest.json     written after every shard is in place (a barrier in between)
    D/latest                        the name of the newest complete step directory

Each file is written to a temporary name in the same directory, flushed, fsync'ed and moved in place
with os.replace, so a crash leaves either the old or the new file, never half of one. A step directory
without a manifest is incomplete and ignored. The manifest records the run's identity (layout,
model, codecs, seed): resuming a different run is refused. On several machines D must be a shared
filesystem (every rank writes its shard, rank 0 the manifest).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geotrain.errors import GeotrainError

MANIFEST = "manifest.json"
LATEST = "latest"


class CheckpointError(GeotrainError, ValueError):
    """No usable checkpoint, or one written by a different run."""


def step_dir(root: str | Path, step: int) -> Path:
    """Directory of the checkpoint taken after `step` completed steps."""
    return Path(root) / f"step-{step:06d}"


def shard_path(root: str | Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:04d}.pt"


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def save_shard(root: str | Path, step: int, rank: int, state: dict[str, Any]) -> Path:
    """Write one rank's state atomically; returns its path."""
    path = shard_path(root, step, rank)
    _atomic_write(path, lambda handle: torch.save(state, handle))
    return path


def write_manifest(root: str | Path, step: int, identity: dict[str, Any], world_size: int) -> Path:
    """Rank 0, after every shard of `step` is written: the manifest, then the `latest` pointer."""
    directory = step_dir(root, step)
    shards = []
    for rank in range(world_size):
        path = shard_path(root, step, rank)
        if not path.exists():
            raise CheckpointError(f"{path}: shard missing, cannot complete checkpoint of step {step}")
        shards.append({"rank": rank, "file": path.name, "bytes": path.stat().st_size})
    manifest = {"step": step, "world_size": world_size, "identity": identity, "shards": shards}
    text = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    _atomic_write(directory / MANIFEST, lambda handle: handle.write(text))
    _atomic_write(Path(root) / LATEST, lambda handle: handle.write(directory.name.encode() + b"\n"))
    return directory / MANIFEST


def latest_step(root: str | Path) -> int | None:
    """The newest complete checkpoint's step, or None if there is none."""
    pointer = Path(root) / LATEST
    if not pointer.exists():
        return None
    name = pointer.read_text().strip()
    if not name.startswith("step-") or not (Path(root) / name / MANIFEST).exists():
        raise CheckpointError(f"{pointer}: points at {name!r}, which is not a complete checkpoint")
    return int(name[len("step-"):])


def read_manifest(root: str | Path, step: int) -> dict[str, Any]:
    path = step_dir(root, step) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest: {exc}") from None


def check_identity(manifest: dict[str, Any], identity: dict[str, Any], source: str) -> None:
    """Refuse to resume a checkpoint of a different run (first differing key named)."""
    saved = manifest.get("identity", {})
    for key in sorted(set(saved) | set(identity)):
        if saved.get(key) != identity.get(key):
            raise CheckpointError(f"{source}: checkpoint was written by a different run: {key} is "
                                  f"{saved.get(key)!r} there, {identity.get(key)!r} now")


def load_shard(root: str | Path, step: int, rank: int) -> dict[str, Any]:
    path = shard_path(root, step, rank)
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read shard: {exc}") from None


def capture_rng() -> dict[str, Any]:
    """Every RNG a worker draws from (torch's default generator; python and numpy for completeness)."""
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
