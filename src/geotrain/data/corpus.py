"""A training corpus: train and validation token ids from a token file, or from text/jsonl tokenized on load.

`load_corpus(PATH)` takes a token file (with its .json sidecar) or text/jsonl (file or directory);
`prepare_token_file(INPUT, OUT)` tokenizes text once into a token file (`geotrain data prepare`).
The validation split is the last val_fraction of the ids (after the documents, in order).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from geotrain.data.sources import DataError, read_documents, source_files
from geotrain.data.text_tokenizers import TextTokenizer, load_text_tokenizer
from geotrain.data.token_file import read_token_file, sidecar_path, write_token_file


@dataclass(frozen=True, eq=False)
class Corpus:
    """Train and validation ids (1-D integer arrays, possibly memmaps), the vocabulary and where they came from."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    tokenizer: str
    source: str

    def check_seq_len(self, seq_len: int) -> None:
        """Both splits must hold at least seq_len + 1 ids (one training window)."""
        for split, ids in (("train", self.train), ("validation", self.val)):
            if len(ids) < seq_len + 1:
                raise DataError(f"data {self.source!r}: the {split} split has {len(ids)} tokens, fewer than "
                                f"seq_len + 1 = {seq_len + 1}")

    def check_vocab(self, model_vocab: int | None, model: str = "the model") -> None:
        """The model's vocabulary must cover the data's (None: the model does not say; not checked)."""
        if model_vocab is not None and self.vocab_size > model_vocab:
            raise DataError(f"data {self.source!r}: vocab_size {self.vocab_size} ({self.tokenizer}) exceeds "
                            f"{model}'s vocabulary of {model_vocab}")


def val_start_for(n_tokens: int, val_fraction: float, source: str = "data") -> int:
    """Index where validation starts: the last round(val_fraction * n) ids (at least 1 when val_fraction > 0)."""
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"{source}: --val-fraction must be in [0, 1), got {val_fraction}")
    held_out = 0 if val_fraction == 0 else max(1, round(val_fraction * n_tokens))
    return n_tokens - held_out


def tokenize_documents(path: str | Path, tokenizer: TextTokenizer) -> tuple[np.ndarray, int]:
    """All documents of `path` as one id array (separator ids between documents) and the document count."""
    pieces, documents = [], 0
    separator = np.asarray(tokenizer.separator, dtype=np.int64)
    for document in read_documents(path):
        if documents:
            pieces.append(separator)
        pieces.append(tokenizer.encode(document.text))
        documents += 1
    return np.concatenate(pieces), documents


def load_corpus(path: str | Path, tokenizer: str = "bytes", val_fraction: float = 0.1) -> Corpus:
    """The corpus of a token file (its sidecar's tokenizer; `tokenizer` is ignored) or of text/jsonl."""
    path = Path(path)
    if path.is_file() and (sidecar_path(path).is_file() or path.suffix == ".bin"):
        ids, sidecar = read_token_file(path)
        val_start = sidecar.get("val_start") or val_start_for(len(ids), val_fraction, str(path))
        return Corpus(ids[:val_start], ids[val_start:], sidecar["vocab_size"], str(sidecar.get("tokenizer", "?")),
                      str(path))
    text_tokenizer = load_text_tokenizer(tokenizer)
    ids, _ = tokenize_documents(path, text_tokenizer)
    val_start = val_start_for(len(ids), val_fraction, str(path))
    return Corpus(ids[:val_start], ids[val_start:], text_tokenizer.vocab_size, text_tokenizer.name, str(path))


def prepare_token_file(source: str | Path, out: str | Path, tokenizer: str = "bytes",
                       val_fraction: float = 0.1) -> dict[str, Any]:
    """Tokenize text/jsonl `source` once into the token file `out` (+ sidecar); return the sidecar written.
    DataError, before anything is read, if `out` or its sidecar is one of the source files (also
    through a symlink, `./` or `..`): writing it would destroy the input."""
    _refuse_overwriting_sources(source, out)
    text_tokenizer = load_text_tokenizer(tokenizer)
    ids, documents = tokenize_documents(source, text_tokenizer)
    val_start = val_start_for(len(ids), val_fraction, str(source))
    meta = {"tokenizer": text_tokenizer.name, "val_start": val_start, "val_fraction": val_fraction,
            "documents": documents, "source": str(source)}
    if val_start == len(ids):
        del meta["val_start"]  # no held-out split: loaders then use their own val_fraction
    return write_token_file(out, ids, text_tokenizer.vocab_size, meta)


def _refuse_overwriting_sources(source: str | Path, out: str | Path) -> None:
    """Compared as files (device, inode), so symlinks, hard links, `./` and `..` are seen through."""
    sources = {(stat.st_dev, stat.st_ino): file for file in source_files(source) for stat in [file.stat()]}
    for target in (Path(out), sidecar_path(out)):
        stat = target.stat() if target.exists() else None
        if stat is not None and (stat.st_dev, stat.st_ino) in sources:
            raise DataError(f"--out {str(out)!r}: {str(target)!r} is the input file "
                            f"{str(sources[stat.st_dev, stat.st_ino])!r}; writing it would destroy the input: "
                            f"choose another output path")
