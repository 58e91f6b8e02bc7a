"""How the CLI talks to people (rich tables, progress on stderr) and machines (one JSON object on stdout).

Every text that reaches rich (messages, table titles, headers, cells, progress labels) goes through
`plain_markup`, so user-supplied names like "evil[/]" print as written and never as markup.
JSON goes through `strict_json_text`: strict JSON always (no NaN/Infinity: non-finite numbers become null).
"""

from __future__ import annotations

import json
import math
import os
import select
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from geotrain.errors import GeotrainError, shown


class OutputError(GeotrainError):
    """Standard output cannot be written (a full disk, /dev/full, a pipe whose reader left)."""


@contextmanager
def writing_stdout() -> Iterator[None]:
    """Turn a failed write to stdout into one OutputError line; stdout then goes to /dev/null, so that
    the interpreter's final flush of what is still buffered does not fail a second time."""
    try:
        yield
    except OSError as exc:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # stdout is not a file (a test's capture): nothing to quiet
            pass
        raise OutputError(f"cannot write to standard output: {exc.strerror or exc}") from None


def write_whole(fd: int, data: bytes) -> None:
    """Write every byte of `data` to file descriptor `fd`, in blocking mode, looping on partial writes.

    O_NONBLOCK lives on the open file description, which a pipe's writers share: a process that set it
    (or a partial write, e.g. one cut by a signal) makes one write(2) return short, and Python's text
    layer over an unbuffered stdout (PYTHONUNBUFFERED, -u) drops the rest silently (CPython gh-85393): a
    large JSON arrived cut at 131,072 bytes with exit 0. Here blocking mode is restored first, and a
    write that would still block (the flag set again meanwhile) waits until `fd` is writable."""
    if not os.get_blocking(fd):
        os.set_blocking(fd, True)
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [])


def write_stdout_whole(text: str) -> None:
    """`text` on stdout, whole (`write_whole` on its descriptor; a stdout without one, e.g. a test's capture,
    gets an ordinary write); a failed write is one OutputError line (`writing_stdout`)."""
    with writing_stdout():
        sys.stdout.flush()  # what was written before goes first
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        write_whole(fd, text.encode(sys.stdout.encoding or "utf-8"))


class Output:
    """Tables and text go to stdout unless `json_mode`; progress always goes to stderr."""

    def __init__(self, json_mode: bool = False, quiet: bool = False) -> None:
        self.json_mode = json_mode
        self.quiet = quiet
        # Pipes and files get a wide fixed width instead of rich's 80 columns, so rows do not wrap.
        self.stdout = Console(file=sys.stdout, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
        self.stderr = Console(file=sys.stderr)

    def text(self, message: str = "") -> None:
        if not self.json_mode:
            with writing_stdout():
                self.stdout.print(plain_markup(message), highlight=False)

    def table(self, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]],
              right_align_from: int = 1) -> None:
        """Print a table; columns from `right_align_from` on are right-aligned (numbers)."""
        if self.json_mode:
            return
        table = Table(title=None if title is None else plain_markup(title), title_justify="left", show_lines=False)
        for i, column in enumerate(columns):
            table.add_column(plain_markup(column), justify="right" if i >= right_align_from else "left")
        for row in rows:
            table.add_row(*(plain_markup(cell) for cell in row))
        with writing_stdout():
            self.stdout.print(table)

    def emit_json(self, obj: Any) -> None:
        """Write exactly one JSON object on stdout, whole at any size (`write_stdout_whole`)."""
        write_stdout_whole(strict_json_text(obj) + "\n")

    @contextmanager
    def progress(self, description: str, total: float, show_after_s: float = 1.0) -> Iterator[Any]:
        """Yield a callback progress(done, total); the bar appears only once work has run `show_after_s`,
        and only on a terminal (a bar written to a pipe or a log file is just noise)."""
        started = time.perf_counter()
        bar: dict[str, Any] = {}

        def update(done: float, new_total: float | None = None) -> None:
            if self.quiet or not self.stderr.is_terminal:
                return
            if "progress" not in bar:
                if time.perf_counter() - started < show_after_s:
                    return
                progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                                    TimeElapsedColumn(), TimeRemainingColumn(), console=self.stderr, transient=True)
                progress.start()
                bar["progress"], bar["task"] = progress, progress.add_task(plain_markup(description),
                                                                           total=new_total or total)
            bar["progress"].update(bar["task"], completed=done, total=new_total or total)

        try:
            yield update
        finally:
            if "progress" in bar:
                bar["progress"].stop()


def format_or(value: Any, spec: str, none: str = "not reached") -> str:
    """A table cell: `value` formatted by `spec`, or `none` where it is None (a target not reached)."""
    return none if value is None else format(value, spec)


def plain_markup(value: Any) -> str:
    """`str(value)` escaped for rich, so that brackets in user text print as written."""
    return escape(str(value))


def strict_json_text(obj: Any, indent: int | None = None) -> str:
    """Strict JSON (RFC 8259) of `obj`: numpy values as plain ones, NaN and +-inf as null."""
    return json.dumps(_finite_plain(obj), allow_nan=False, indent=indent)


def write_json_file(obj: Any, path: str) -> None:
    """Write `obj` as indented strict JSON to `path` (e.g. `plan --out`); GeotrainError names the file."""
    try:
        Path(path).write_text(strict_json_text(obj, indent=2) + "\n")
    except OSError as exc:
        raise GeotrainError(f"{shown(path)}: cannot write: {exc.strerror}") from None


def _finite_plain(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {_finite_plain(k) if not isinstance(k, str) else k: _finite_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_plain(v) for v in value]
    import numpy as np

    if isinstance(value, (np.ndarray, np.generic)):
        return _finite_plain(value.tolist())
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
