"""Where a run's metrics, trace and TensorBoard files go, and how many old runs are kept.

`geotrain train` without --run-dir writes to DEFAULT_ROOT/<UTC time>-<plan> under the working directory
(as TensorBoard's own `runs/` default), prints the path at start and puts it in --json as "run_dir".
Retention: before a new default run directory is made, the oldest ones under the same root are removed
so that at most KEEP_RUNS remain, the new one included (override with GEOTRAIN_KEEP_RUNS). A directory
is recognised as a run's by its RUN_MARKER file: nothing else under the root is touched, and a directory
given with --run-dir is never removed by retention. Unlike geotrain.procs.rundir (the launcher's
temporary files, removed at exit), these outlive the process: they are what the user reads afterwards.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from geotrain.errors import GeotrainError

DEFAULT_ROOT = "geotrain-runs"
KEEP_RUNS = 20
KEEP_ENV = "GEOTRAIN_KEEP_RUNS"
RUN_MARKER = "run.json"
NO_RUN_DIR = "none"


class RunDirError(GeotrainError, ValueError):
    """A run directory that cannot be used (not writable, or another run's)."""


def keep_runs() -> int:
    value = os.environ.get(KEEP_ENV, str(KEEP_RUNS))
    if not value.isdigit() or int(value) < 1:
        raise RunDirError(f"{KEEP_ENV}: an integer >= 1, got {value!r}")
    return int(value)


def default_run_dir(plan_name: str, root: Path | str = DEFAULT_ROOT, now: float | None = None) -> Path:
    """A new, empty directory root/<YYYYmmdd-HHMMSS>-<plan> (UTC; the plan name reduced to [A-Za-z0-9_.-]),
    made here so that two runs starting in the same second (parallel tests) get two: the second gets a
    suffix -2, -3..."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", plan_name)[:40] or "run"
    Path(root).mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        path = Path(root) / (f"{stamp}-{name}" if n == 1 else f"{stamp}-{name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def sweep_old_runs(root: Path | str, keep: int) -> list[Path]:
    """Remove the oldest run directories under `root` (by name: the names start with the time) so that
    `keep` - 1 remain, room for the next; returns those removed."""
    root = Path(root)
    if not root.is_dir():
        return []
    runs = sorted(p for p in root.iterdir() if p.is_dir() and (p / RUN_MARKER).is_file())
    doomed = runs[:max(0, len(runs) - (keep - 1))]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def check_run_dir(path: Path | str) -> None:
    """RunDirError if `path` already holds a run's metrics (two runs' lines would mix) or is a file."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--run-dir {path}: is a file, not a directory")
    if (path / "metrics").is_dir() and any((path / "metrics").iterdir()):
        raise RunDirError(f"--run-dir {path}: already holds a run's metrics (choose a new directory or remove it)")


def prepare_run_dir(path: Path | str, about: dict[str, Any]) -> Path:
    """Make `path` (parents too) and write its RUN_MARKER with `about` (plan, cluster, layout...), after
    `check_run_dir`."""
    path = Path(path)
    check_run_dir(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / RUN_MARKER).write_text(json.dumps(about, indent=1))
    except OSError as exc:
        raise RunDirError(f"--run-dir {path}: cannot write there: {exc.strerror or exc}") from None
    return path


def read_about(path: Path | str) -> dict[str, Any]:
    """The RUN_MARKER of a run directory ({} when absent)."""
    marker = Path(path) / RUN_MARKER
    return json.loads(marker.read_text()) if marker.is_file() else {}
