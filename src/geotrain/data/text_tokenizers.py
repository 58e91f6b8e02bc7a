"""Tokenizers for real text: UTF-8 bytes (256 ids, the default) or a local Hugging Face tokenizer directory.

Both map a document to an int64 numpy array of ids and say which ids separate documents
(bytes: a newline; HF: the tokenizer's end-of-text token, when it has one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from geotrain.data.sources import DataError


class TextTokenizer(Protocol):
    name: str
    vocab_size: int
    separator: tuple[int, ...]

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Any) -> str: ...


class ByteTokenizer:
    """One token per UTF-8 byte: ids 0..255; documents separated by a newline (id 10)."""

    name = "bytes"
    vocab_size = 256
    separator = (10,)

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Any) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A tokenizer saved in a local directory (tokenizer.json etc.), loaded with local_files_only."""

    def __init__(self, directory: str) -> None:
        if not Path(directory).is_dir():
            raise DataError(f"tokenizer 'hf:{directory}': no such local directory (geotrain never downloads)")
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise DataError(f"tokenizer 'hf:{directory}' needs transformers (pip install 'geotrain[hf]')") from None
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise DataError(f"tokenizer 'hf:{directory}': cannot load: {str(exc)[:160]}") from None
        self.name = f"hf:{directory}"
        self.vocab_size = len(self._tokenizer)
        eos = self._tokenizer.eos_token_id
        self.separator = () if eos is None else (int(eos),)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)

    def decode(self, ids: Any) -> str:
        return self._tokenizer.decode([int(i) for i in ids])


def load_text_tokenizer(spec: str) -> TextTokenizer:
    """"bytes" or "hf:<local tokenizer directory>"."""
    if spec == "bytes":
        return ByteTokenizer()
    if spec.startswith("hf:") and len(spec) > 3:
        return HFTokenizer(spec[3:])
    raise DataError(f"--tokenizer: expected bytes or hf:<local tokenizer directory>, got {spec[:80]!r}")
