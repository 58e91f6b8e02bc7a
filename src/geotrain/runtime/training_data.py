"""What the workers train and validate on: the synthetic world (no --data) or a corpus (--data FILE|DIR).

Batches are a pure function of (data seed, step, replica) (geotrain.data.replica_batch), so a
resumed or re-planned run trains on the same windows. `data_identity` fingerprints the data files
(size and sha256 of every file, without tokenizing) for the checkpoint identity. `check_training_data`
loads --data once before any worker starts, so that a missing, empty or too short corpus is one line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geotrain.data import (DataError, WorldTokens, batch_starts, load_corpus, replica_batch, sidecar_path,
                           source_files, window_count, window_ids, world_tokens)


@dataclass(frozen=True, eq=False)
class TrainingData:
    """Train and validation ids (1-D integer arrays), the vocabulary size and how training windows are drawn
    (`windows`: geotrain.data.WINDOW_MODES; `epoch_windows` > 0: "epochs" draws from the first that many)."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    source: str
    windows: str = "random"
    epoch_windows: int = 0

    def batch(self, seed: int, step: int, replica: int, replicas: int, per_replica: int,
              seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This replica's (inputs, targets) of `step`: int64 (per_replica, seq_len) each."""
        return replica_batch(self.train, seed, step, replica, replicas, per_replica * replicas, seq_len, self.windows,
                             self.epoch_windows)

    def share(self, seed: int, step: int, first: int, count: int, global_batch: int,
              seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows first..first + count - 1 of `step`'s global batch of `global_batch` windows (a replica's
        batch share, runtime/batch_shares.py): (inputs, targets), int64 (count, seq_len) each."""
        starts = batch_starts(seed, step, len(self.train), seq_len, global_batch, self.windows,
                              self.epoch_windows)[first:first + count]
        windows = torch.from_numpy(np.asarray(self.train)[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64))
        return windows[:, :-1], windows[:, 1:]

    def share_ids(self, seed: int, step: int, first: int, count: int, global_batch: int, seq_len: int) -> np.ndarray:
        """The identities (geotrain.data.window_ids) of the windows `share` returns, in its order."""
        return window_ids(seed, step, len(self.train), seq_len, global_batch, self.windows,
                          self.epoch_windows)[first:first + count]

    def sample_count(self, seq_len: int) -> int:
        """How many distinct training windows (samples) of `seq_len` tokens the run draws from."""
        return window_count(len(self.train), seq_len, self.windows, self.epoch_windows)


def load_training_data(data: str | None, data_seed: int, val_fraction: float,
                       world: WorldTokens | None = None, windows: str = "random",
                       epoch_windows: int = 0) -> TrainingData:
    """The world of `data_seed` (data None; `world` if the caller built it) or the corpus at `data`
    (text, jsonl, token file, directory); training windows drawn as `windows` says."""
    if data is None:
        world = world if world is not None else world_tokens(data_seed)
        return TrainingData(world.train.numpy(), world.val.numpy(), world.vocab_size, f"world:{data_seed}", windows,
                            epoch_windows)
    corpus = load_corpus(data, val_fraction=val_fraction)
    return TrainingData(corpus.train, corpus.val, corpus.vocab_size, corpus.source, windows, epoch_windows)


def check_training_data(data: str | None, val_fraction: float, seq_len: int, evaluates: bool) -> None:
    """Before any process starts: the corpus at `data` loads (DataError for a missing, unreadable or empty
    file) and its train split holds one training sequence of `seq_len` + 1 tokens, its validation split too
    when the run `evaluates`. No data (the synthetic world): nothing to check."""
    if data is None:
        return
    corpus = load_corpus(data, val_fraction=val_fraction)
    need = seq_len + 1
    for split, ids in (("train", corpus.train), ("validation", corpus.val))[:2 if evaluates else 1]:
        if len(ids) < need:
            raise DataError(f"data {data!r}: its {split} split holds {len(ids)} tokens ({corpus.tokenizer}), fewer "
                            f"than one sequence of seq_len + 1 = {need}: give more text or a shorter --seq-len")


def data_files(data: str) -> list[Path]:
    """The files whose bytes are the data: a token file and its sidecar, or the text/jsonl files."""
    path = Path(data)
    if path.is_file() and (sidecar_path(path).is_file() or path.suffix == ".bin"):
        return [path] + ([sidecar_path(path)] if sidecar_path(path).is_file() else [])
    return source_files(path)


def data_identity(data: str | None, data_seed: int, val_fraction: float) -> dict[str, Any]:
    """What identifies the training data of a run: the world's seed, or every data file's size and sha256."""
    if data is None:
        return {"world": data_seed}
    files = []
    for path in data_files(data):
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
        except OSError as exc:
            raise DataError(f"data {str(path)!r}: cannot read: {exc.strerror or exc}") from None
        files.append({"file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()})
    return {"files": files, "val_fraction": val_fraction}
