"""Token files: nanoGPT-style raw little-endian uint16/uint32 ids plus a small JSON sidecar.

    tokens.bin        the ids of all documents, train then validation, no header
    tokens.bin.json   {"format": "geotrain-tokens/1", "dtype": "uint16", "vocab_size": 256,
                       "tokenizer": "bytes", "tokens": N, "val_start": V, ...}

Only "dtype" and "vocab_size" are required, so a nanoGPT train.bin gets a sidecar by hand:
{"dtype": "uint16", "vocab_size": 50257}. Without "val_start" the loader holds out the last
val_fraction of the ids. Files are memory-mapped, never read whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from geotrain.data.sources import DataError

FORMAT = "geotrain-tokens/1"
DTYPES: dict[str, np.dtype] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_SCAN_CHUNK = 1 << 24  # ids per chunk when checking a file's largest id


def sidecar_path(path: str | Path) -> Path:
    return Path(f"{path}.json")


def dtype_for_vocab(vocab_size: int) -> str:
    """The smallest token dtype holding ids 0..vocab_size-1."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def write_token_file(path: str | Path, ids: np.ndarray, vocab_size: int, meta: dict[str, Any]) -> dict[str, Any]:
    """Write `ids` (1-D ints < vocab_size) and the sidecar (meta + format, dtype, vocab_size, tokens); return the sidecar."""
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise DataError(f"token ids must lie in 0..{vocab_size - 1}, got {int(ids.min())}..{int(ids.max())}")
    dtype = dtype_for_vocab(vocab_size)
    sidecar = {"format": FORMAT, "dtype": dtype, "vocab_size": int(vocab_size), "tokens": int(ids.size), **meta}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    # Both files are written under temporary names beside their targets and renamed only when
    # complete, so an interrupted or failed write leaves the old files (or none), never half of one.
    side = sidecar_path(path)
    tmp_ids, tmp_side = (target.with_name(f".{target.name}.tmp-{os.getpid()}") for target in (Path(path), side))
    try:
        ids.astype(DTYPES[dtype]).tofile(tmp_ids)
        tmp_side.write_text(json.dumps(sidecar, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp_ids, path)
        os.replace(tmp_side, side)
    except OSError as exc:
        raise DataError(f"data {str(path)!r}: cannot write token file: {exc.strerror or exc}") from None
    finally:
        tmp_ids.unlink(missing_ok=True)
        tmp_side.unlink(missing_ok=True)
    return sidecar


def _read_sidecar(path: Path) -> dict[str, Any]:
    side = sidecar_path(path)
    if not side.is_file():
        raise DataError(f"data {str(path)!r}: no sidecar {side.name} naming the dtype and vocab_size "
                        "(write {\"dtype\": \"uint16\", \"vocab_size\": N} or run `geotrain data prepare`)")
    try:
        sidecar = json.loads(side.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"data {str(side)!r}: not a JSON object: {str(exc)[:100]}") from None
    if not isinstance(sidecar, dict):
        raise DataError(f"data {str(side)!r}: not a JSON object")
    if sidecar.get("dtype") not in DTYPES:
        raise DataError(f"data {str(side)!r}: dtype: must be one of {sorted(DTYPES)}, got {sidecar.get('dtype')!r}")
    vocab = sidecar.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise DataError(f"data {str(side)!r}: vocab_size: must be an integer >= 1, got {vocab!r}")
    return sidecar


def read_token_file(path: str | Path) -> tuple[np.ndarray, dict[str, Any]]:
    """The ids of a token file (read-only memmap) and its sidecar, after checking size and id range.

    Raises DataError for a missing/bad sidecar, an empty file, a size that is not a whole number
    of ids or disagrees with the sidecar's "tokens", an id >= vocab_size, or a bad "val_start".
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data {str(path)!r}: no such file")
    sidecar = _read_sidecar(path)
    dtype = DTYPES[sidecar["dtype"]]
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"data {str(path)!r}: file is empty")
    if size % dtype.itemsize:
        raise DataError(f"data {str(path)!r}: {size} bytes is not a whole number of {sidecar['dtype']} ids")
    n = size // dtype.itemsize
    if "tokens" in sidecar and sidecar["tokens"] != n:
        raise DataError(f"data {str(path)!r}: tokens: sidecar says {sidecar['tokens']}, the file holds {n}")
    ids = np.memmap(path, dtype=dtype, mode="r")
    vocab = sidecar["vocab_size"]
    for start in range(0, n, _SCAN_CHUNK):
        chunk = np.asarray(ids[start:start + _SCAN_CHUNK])
        if int(chunk.max()) >= vocab:
            offset = start + int(np.argmax(chunk >= vocab))
            raise DataError(f"data {str(path)!r}: token {offset}: id {int(ids[offset])} >= vocab_size {vocab}")
    val_start = sidecar.get("val_start")
    if val_start is not None and (not isinstance(val_start, int) or not 0 < val_start <= n):
        raise DataError(f"data {str(path)!r}: val_start: must be an integer in 1..{n}, got {val_start!r}")
    return ids, sidecar
