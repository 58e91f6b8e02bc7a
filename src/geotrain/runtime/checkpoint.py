"""Sharded checkpoints, written atomically and verified before anything of them is used.

Layout under the checkpoint directory D:

    D/step-000012/rank-0003.pt      one per rank: model shard, optimizer, codec residuals, RNG, records
    D/step-000012/manifest.json     written after every shard is in place (a barrier in between)
    D/latest                        the name of the newest complete step directory

Each file is written to a temporary name in the same directory, flushed, fsync'ed and moved in place
with os.replace, so a crash leaves either the old or the new file, never half of one. A step directory
without a manifest is incomplete and ignored. The manifest records the run's identity (layout,
model, codecs, seed; resuming a different run is refused) and, per shard, its size and sha256.

Loading a shard: read its bytes once, check size and sha256 against the manifest (a flipped byte,
a truncated or swapped file is refused, naming it), unpickle those same bytes with
`torch.load(weights_only=True)` (tensors and plain containers only: a crafted pickle cannot run
code), then check the shard's own header (rank, stage, replica) against the slot it is loaded into and its run header (the sha256 of the
manifest's identity, and the step) against the checkpoint, so that a shard of another run copied in
with the manifest re-hashed is refused by name.
Shards hold tensors and primitives only (RNG states included) so that weights_only suffices.
On several machines D must be a shared filesystem (every rank writes its shard, rank 0 the manifest).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geotrain.errors import GeotrainError

MANIFEST = "manifest.json"
LATEST = "latest"
FORMAT = 3
"""Checkpoint format: 2 = sha256 per shard, weights_only shards with a slot header; 3 = the header
also names the run (its identity's sha256) and the step."""
MAX_MANIFEST_BYTES = 1 << 20
STEP_NAME = re.compile(r"step-(\d{6,12})")


class CheckpointError(GeotrainError, ValueError):
    """No usable checkpoint, a damaged or foreign one, or a checkpoint directory that cannot be used."""


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def step_dir(root: str | Path, step: int) -> Path:
    """Directory of the checkpoint taken after `step` completed steps."""
    return Path(root) / f"step-{step:06d}"


def shard_path(root: str | Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:04d}.pt"


def _atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to a temporary name beside `path`, fsync, rename; a full disk is a
    CheckpointError naming the directory (and the temporary file is removed)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CheckpointError(f"no space left on {path.parent} (writing {path.name}, {len(data)} bytes)") from None
        raise CheckpointError(f"{path}: cannot write checkpoint file ({exc.strerror or exc})") from None


def identity_digest(identity: dict[str, Any]) -> str:
    """sha256 of the run's identity (canonical JSON): what each shard's header names its run by."""
    return _sha256(json.dumps(identity, sort_keys=True).encode())


def save_shard(root: str | Path, step: int, rank: int, state: dict[str, Any], identity: dict[str, Any]) -> Path:
    """Write one rank's state atomically; returns its path. `state` holds tensors and primitives only
    (with its "slot" header); a "run" header (the identity's sha256 and the step) is added here."""
    path = shard_path(root, step, rank)
    buffer = io.BytesIO()  # serialised in memory: a full disk is then a plain OSError from write()
    torch.save({**state, "run": {"identity_sha256": identity_digest(identity), "step": step}}, buffer)
    _atomic_write(path, buffer.getvalue())
    return path


def _open_regular(path: Path) -> Any:
    """Open a regular file for reading; OSError for anything else (a FIFO or device would block
    or never end)."""
    if not path.is_file():
        kind = "missing" if not path.exists() else "not a regular file"
        raise OSError(f"{kind}")
    return open(path, "rb")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def shard_state(slot: dict[str, int], assignment: list[list[int]], stage: dict[str, Any], boundaries: Any,
                dp: dict[str, Any], completed: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """What one shard holds (the non-elastic workers' and an elastic writer group's alike): its slot
    header, the plan's `assignment` (device per slot), the stage's weights (the state dict of the
    ModuleList of its stage modules), the stage cut, the gradient sync's state (optimizer, residuals,
    outer anchor), this process's RNG states, the completed step count and the per-step records."""
    return {"slot": slot, "assignment": assignment, "stage": stage, "boundaries": [int(b) for b in boundaries],
            "dp": dp, "rng": capture_rng(), "completed": completed, "records": records}


def write_manifest(root: str | Path, step: int, identity: dict[str, Any], world_size: int,
                   written_by: dict[str, Any] | None = None) -> Path:
    """Rank 0, after every shard of `step` is written: the manifest (sizes, sha256), then `latest`.
    `written_by`: how the shards came to be, when not one per rank of the run (an elastic run's writer
    group: runtime/elastic/checkpoint.py); recorded, not checked."""
    directory = step_dir(root, step)
    shards = []
    for rank in range(world_size):
        path = shard_path(root, step, rank)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CheckpointError(f"{path}: shard missing, cannot complete checkpoint of step {step} "
                                  f"({exc.strerror or exc})") from None
        shards.append({"rank": rank, "file": path.name, "bytes": len(data), "sha256": _sha256(data)})
    manifest = {"format": FORMAT, "step": step, "world_size": world_size, "identity": identity, "shards": shards,
                **({"written_by": written_by} if written_by is not None else {})}
    text = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    _atomic_write(directory / MANIFEST, text)
    _atomic_write(Path(root) / LATEST, directory.name.encode() + b"\n")
    return directory / MANIFEST


def latest_step(root: str | Path) -> int | None:
    """The newest complete checkpoint's step, or None if there is none (no `latest` pointer)."""
    pointer = Path(root) / LATEST
    if not pointer.exists() and not pointer.is_symlink():
        return None
    try:
        with _open_regular(pointer) as handle:
            raw = handle.read(64)
        name = raw.decode("ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = "not ASCII text" if isinstance(exc, UnicodeDecodeError) else (exc.strerror or str(exc))
        raise CheckpointError(f"{pointer}: unreadable checkpoint pointer ({why})") from None
    match = STEP_NAME.fullmatch(name)
    if match is None:
        raise CheckpointError(f"{pointer}: must name a step directory like 'step-000012', got {_short(name)}")
    if not (Path(root) / name / MANIFEST).is_file():
        raise CheckpointError(f"{pointer}: points at {name!r}, which is not a complete checkpoint (no {MANIFEST})")
    return int(match.group(1))


def read_manifest(root: str | Path, step: int) -> dict[str, Any]:
    """The manifest of `step`, checked for shape (format, step, world size, one entry per shard)."""
    path = step_dir(root, step) / MANIFEST
    try:
        with _open_regular(path) as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise CheckpointError(f"{path}: manifest larger than {MAX_MANIFEST_BYTES} bytes")
        manifest = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        detail = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: unreadable manifest: {detail}") from None
    _check_manifest(manifest, path, step)
    return manifest


def _check_manifest(manifest: Any, path: Path, step: int) -> None:
    def bad(key: str, expected: str, value: Any) -> CheckpointError:
        return CheckpointError(f"{path}: {key}: must be {expected}, got {_short(value)}")

    if not isinstance(manifest, dict):
        raise bad("top level", "a JSON object", type(manifest).__name__)
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format: checkpoint format {_short(manifest.get('format'))} is not "
                              f"{FORMAT} (written by another geotrain version)")
    if manifest.get("step") != step or isinstance(manifest.get("step"), bool):
        raise bad("step", f"{step} (its directory)", manifest.get("step"))
    world_size = manifest.get("world_size")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise bad("world_size", "a positive integer", world_size)
    if not isinstance(manifest.get("identity"), dict):
        raise bad("identity", "an object", manifest.get("identity"))
    shards = manifest.get("shards")
    if not isinstance(shards, list) or len(shards) != world_size:
        raise bad("shards", f"a list of {world_size} entries", shards)
    for rank, entry in enumerate(shards):
        key = f"shards[{rank}]"
        if not isinstance(entry, dict):
            raise bad(key, "an object", entry)
        if entry.get("rank") != rank or entry.get("file") != f"rank-{rank:04d}.pt":
            raise bad(key, f"rank {rank}, file rank-{rank:04d}.pt", entry)
        if not isinstance(entry.get("bytes"), int) or isinstance(entry.get("bytes"), bool) or entry["bytes"] < 0:
            raise bad(f"{key}.bytes", "a byte count", entry.get("bytes"))
        if not isinstance(entry.get("sha256"), str) or not re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]):
            raise bad(f"{key}.sha256", "64 hex digits", entry.get("sha256"))


def check_identity(manifest: dict[str, Any], identity: dict[str, Any], source: str) -> None:
    """Refuse to resume a checkpoint of a different run (first differing key named)."""
    saved = manifest.get("identity", {})
    for key in sorted(set(saved) | set(identity)):
        if saved.get(key) != identity.get(key):
            raise CheckpointError(f"{source}: checkpoint was written by a different run: {key} is "
                                  f"{_short(saved.get(key))} there, {_short(identity.get(key))} now")


def _verified_bytes(root: str | Path, step: int, rank: int, manifest: dict[str, Any]) -> bytes:
    """The shard's bytes, read once, after checking its size and sha256 against the manifest."""
    path = shard_path(root, step, rank)
    if rank >= len(manifest["shards"]):
        raise CheckpointError(f"{path}: the manifest lists {len(manifest['shards'])} shards, not rank {rank}")
    entry = manifest["shards"][rank]
    try:
        with _open_regular(path) as handle:
            data = handle.read(entry["bytes"] + 1)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read shard: {exc.strerror or exc}") from None
    if len(data) != entry["bytes"]:
        size = f"{len(data)}" if len(data) <= entry["bytes"] else f"more than {entry['bytes']}"
        raise CheckpointError(f"{path}: shard is {size} bytes, the manifest says {entry['bytes']} "
                              f"(truncated or replaced); refusing it")
    if _sha256(data) != entry["sha256"]:
        raise CheckpointError(f"{path}: sha256 does not match the manifest (corrupted or replaced); refusing it")
    return data


def _load_failure(exc: Exception) -> str:
    """The informative line of torch.load's error (the weights-only unpickler's reason if there is one)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line] or [type(exc).__name__]
    reason = next((line for line in lines if "WeightsUnpickler error" in line), lines[0])
    return reason.split(". ")[0][:200]  # the first sentence; torch's advice to trust the file is omitted


def verify_shards(root: str | Path, step: int, manifest: dict[str, Any]) -> None:
    """Check every shard of `step` against the manifest (size, sha256) without unpickling anything."""
    for rank in range(manifest["world_size"]):
        _verified_bytes(root, step, rank, manifest)


def load_shard(root: str | Path, step: int, rank: int, manifest: dict[str, Any],
               slot: dict[str, int]) -> dict[str, Any]:
    """Rank `rank`'s verified state: size and sha256 as in the manifest, tensors and primitives only
    (weights_only), and a header `slot` equal to the given {"rank", "stage", "replica"}."""
    path = shard_path(root, step, rank)
    data = _verified_bytes(root, step, rank, manifest)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure: refuse the file
        raise CheckpointError(f"{path}: refused (not a plain tensor checkpoint): {_load_failure(exc)}") from None
    if not isinstance(state, dict) or state.get("slot") != slot:
        header = state.get("slot") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path}: shard header is {_short(header)}, expected {slot}: "
                              f"a shard of another slot was put here; refusing it")
    run = {"identity_sha256": identity_digest(manifest["identity"]), "step": step}
    if state.get("run") != run:
        raise CheckpointError(f"{path}: shard header names run {_short(state.get('run'), 120)}, this checkpoint "
                              f"is {run}: a shard of another run or step was put here; refusing it")
    return state


def has_checkpoints(root: str | Path) -> list[str]:
    """Names of what marks `root` as holding a run's checkpoints: `latest` and step-* entries."""
    path = Path(root)
    if not path.is_dir():
        return []
    return sorted(entry.name for entry in path.iterdir() if entry.name == LATEST or STEP_NAME.fullmatch(entry.name))


def prepare_directory(root: str | Path, resume: bool, overwrite: bool, clear: bool = True) -> None:
    """Before any worker starts: `root` must be (or become) a writable directory; a new run
    (not `resume`) refuses a directory holding another run's checkpoints unless `overwrite`, which
    then removes them (`latest` and step-* only; other files stay) when `clear` is set."""
    path = Path(root)
    if resume and overwrite:
        raise CheckpointError(f"{path}: --resume and --overwrite exclude each other")
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path}: --checkpoint-dir exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".geotrain-write-test-{os.getpid()}"
        with open(probe, "wb") as handle:
            handle.write(b"ok")
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"{path}: --checkpoint-dir is not writable ({exc.strerror or exc})") from None
    found = has_checkpoints(path)
    if resume or not found:
        return
    if not overwrite:
        raise CheckpointError(f"{path}: holds another run's checkpoints ({', '.join(found[:3])}"
                              f"{', ...' if len(found) > 3 else ''}); pass --resume to continue it "
                              f"or --overwrite to replace it")
    if clear:
        for name in found:
            entry = path / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink(missing_ok=True)


def _manifest_format(directory: Path) -> Any:
    """The "format" of `directory`'s manifest; None when it has none or it cannot be read."""
    try:
        with _open_regular(directory / MANIFEST) as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
        manifest = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_MANIFEST_BYTES else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    return manifest.get("format") if isinstance(manifest, dict) else None


def prune_checkpoints(root: str | Path, keep: int, protect: tuple[int, ...] = ()) -> list[str]:
    """Delete the complete checkpoints of `root` (step directories with a manifest of this FORMAT) but the
    newest `keep` by step; the one `latest` names and the steps in `protect` (the checkpoint a resumed run
    started from) always stay, and so do incomplete directories and those of another format. Returns the
    names deleted, oldest first. Rank 0 calls it after each manifest (`keep` >= 1)."""
    if keep < 1:
        raise CheckpointError(f"{root}: keep_checkpoints must be at least 1, got {keep}")
    path = Path(root)
    complete = sorted(int(match.group(1)) for entry in path.iterdir()
                      for match in [STEP_NAME.fullmatch(entry.name)]
                      if match and entry.is_dir() and not entry.is_symlink() and _manifest_format(entry) == FORMAT)
    try:
        newest = latest_step(path)
    except CheckpointError:
        return []  # no trustworthy pointer: delete nothing
    kept = set(complete[-keep:]) | set(protect) | {newest}
    gone = [step for step in complete if step not in kept]
    for step in gone:
        shutil.rmtree(step_dir(path, step), ignore_errors=True)
    return [step_dir(path, step).name for step in gone]


def capture_rng() -> dict[str, Any]:
    """Every RNG a worker draws from (torch's default generator; python and numpy for completeness),
    as tensors and primitives (so that a weights_only load restores them)."""
    numpy_state = np.random.get_state(legacy=False)
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": {"key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                      "pos": int(numpy_state["state"]["pos"]), "has_gauss": int(numpy_state["has_gauss"]),
                      "gauss": float(numpy_state["gauss"])}}


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    numpy_state = state["numpy"]
    np.random.set_state(("MT19937", numpy_state["key"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["gauss"]))
