"""Read documents from plain text and jsonl files (a file or a directory of them), with errors that point at the spot.

A text file (.txt, .md, .text) is one document; a jsonl file (.jsonl, .ndjson) holds one JSON object
per line whose "text" field is a document (blank lines are skipped). A directory contributes its
files of those kinds, recursively, in sorted path order. Files must be UTF-8 and non-empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from geotrain.errors import GeotrainError

TEXT_SUFFIXES: tuple[str, ...] = (".txt", ".md", ".text")
JSONL_SUFFIXES: tuple[str, ...] = (".jsonl", ".ndjson")


class DataError(GeotrainError, ValueError):
    """A data file or option is unusable: names the file (and line / offset) and the offending value."""


@dataclass(frozen=True)
class Document:
    """One document's text and where it came from ("file" or "file:line")."""

    text: str
    origin: str


def source_files(path: str | Path) -> list[Path]:
    """The text/jsonl files of `path` (itself, or a directory's, sorted)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DataError(f"data {str(path)!r}: no such file or directory")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES + JSONL_SUFFIXES)
    if not files:
        raise DataError(f"data {str(path)!r}: directory holds no {'/'.join(TEXT_SUFFIXES + JSONL_SUFFIXES)} files")
    return files


def _read_utf8(path: Path) -> str:
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(f"data {str(path)!r}: file is empty")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"data {str(path)!r}: line {line} (byte {exc.start}): not UTF-8 text "
                        f"(byte {raw[exc.start:exc.start + 1]!r})") from None


def _jsonl_documents(path: Path, text: str) -> Iterator[Document]:
    found = False
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"data {str(path)!r}: line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg}): {line[:60]!r}") from None
        if not isinstance(record, dict) or "text" not in record:
            raise DataError(f"{where}: text: missing (each line must be an object with a \"text\" field): {line[:60]!r}")
        if not isinstance(record["text"], str):
            raise DataError(f"{where}: text: must be a string, got {type(record['text']).__name__}")
        found = True
        yield Document(record["text"], f"{path}:{number}")
    if not found:
        raise DataError(f"data {str(path)!r}: file is empty (no jsonl records)")


def read_documents(path: str | Path) -> Iterator[Document]:
    """Every document of `path` (file or directory), in order; raises DataError at the first bad spot."""
    for file in source_files(path):
        text = _read_utf8(file)
        if file.suffix.lower() in JSONL_SUFFIXES:
            yield from _jsonl_documents(file, text)
        else:
            yield Document(text, str(file))
