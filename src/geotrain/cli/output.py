"""How the CLI talks to people (rich tables, progress on stderr) and machines (one JSON object on stdout)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


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
            self.stdout.print(message, highlight=False)

    def table(self, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]],
              right_align_from: int = 1) -> None:
        """Print a table; columns from `right_align_from` on are right-aligned (numbers)."""
        if self.json_mode:
            return
        table = Table(title=title, title_justify="left", show_lines=False)
        for i, column in enumerate(columns):
            table.add_column(column, justify="right" if i >= right_align_from else "left")
        for row in rows:
            table.add_row(*(escape(str(cell)) for cell in row))
        self.stdout.print(table)

    def emit_json(self, obj: Any) -> None:
        """Write exactly one JSON object on stdout."""
        sys.stdout.write(json.dumps(obj, default=_json_default) + "\n")
        sys.stdout.flush()

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
                bar["progress"], bar["task"] = progress, progress.add_task(description, total=new_total or total)
            bar["progress"].update(bar["task"], completed=done, total=new_total or total)

        try:
            yield update
        finally:
            if "progress" in bar:
                bar["progress"].stop()


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
