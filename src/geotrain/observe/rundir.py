"""Where a run's metrics, trace and TensorBoard files go, and how many old runs are kept.

`geotrain train` without --run-dir writes to DEFAULT_ROOT/<UTC time>-<plan> under the working directory
(as TensorBoard's own `runs/` default), prints the path at start and puts it in --json as "run_dir".

Retention: when a launcher opens a new default run directory, the oldest ones under the same root are removed
so that at most KEEP_RUNS remain, the new one included (override with GEOTRAIN_KEEP_RUNS, a plain integer >= 1).
Only directories geotrain made as default run directories are candidates: `default_run_dir` puts a
CREATED_MARKER file in each, and its launcher holds an exclusive `fcntl.flock` on that file for the run's life
(`RunLock`). The kernel drops the lock when the launcher exits, however it ends (SIGKILL included), so
`sweep_old_runs` can tell a live run (the lock is held: never removed) from a finished one. A directory given
with --run-dir has no marker and is never removed, under DEFAULT_ROOT or not; nor is anything else there (files,
symlinks, other directories). The oldest is the one whose marker was written first (its modification time).
Unlike geotrain.procs.rundir (the launcher's temporary files, removed at exit), these outlive the process:
they are what the user reads afterwards.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import re
import shutil
import socket
import time

from pathlib import Path
from typing import Any

from geotrain.errors import GeotrainError, shown
from geotrain.procs.held_lock import HeldLock

DEFAULT_ROOT = "geotrain-runs"
KEEP_RUNS = 20
KEEP_ENV = "GEOTRAIN_KEEP_RUNS"
RUN_MARKER = "run.json"
CREATED_MARKER = ".geotrain-default-run"
"""In a default run directory: geotrain made it (retention may remove it once its launcher's lock is gone)."""
NO_RUN_DIR = "none"


class RunDirError(GeotrainError, ValueError):
    """A run directory that cannot be used (not writable, or another run's)."""


class RunLock(HeldLock):
    """The launcher's hold on a default run directory: while it is held, `sweep_old_runs` of any process leaves
    the directory alone."""


def keep_runs() -> int:
    """GEOTRAIN_KEEP_RUNS (ASCII digits, >= 1; KEEP_RUNS when unset); RunDirError otherwise."""
    value = os.environ.get(KEEP_ENV, str(KEEP_RUNS))
    if not re.fullmatch(r"[0-9]{1,9}", value.strip()) or int(value) < 1:  # str.isdigit takes '²'
        raise RunDirError(f"{KEEP_ENV}: an integer >= 1 (how many default run directories to keep), "
                          f"got {shown(value)}")
    return int(value)


def _locked_marker(path: Path) -> RunLock:
    """Write path/CREATED_MARKER (pid and host) already locked: made under a temporary name, locked, then
    renamed, so no sweep ever sees the marker of a starting run unlocked."""
    temporary = path / f"{CREATED_MARKER}.{os.getpid()}"
    handle = open(temporary, "w+b")  # noqa: SIM115 - held open for the run's life
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
    handle.write(f"{os.getpid()} {socket.gethostname()}\n".encode())
    handle.flush()
    os.rename(temporary, path / CREATED_MARKER)
    return RunLock(path, _handle=handle)


def default_run_dir(plan_name: str, root: Path | str = DEFAULT_ROOT, now: float | None = None) -> RunLock:
    """Make a new, empty directory root/<YYYYmmdd-HHMMSS>-<plan> (UTC; the plan name reduced to
    [A-Za-z0-9_.-]) holding only its CREATED_MARKER, locked by the caller until it releases the returned
    lock or exits. Two runs starting in the same second (parallel tests) get two: the second a suffix -2, -3...
    RunDirError (one line) where root cannot be made or written (a read-only directory, a file named root)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", plan_name)[:40] or "run"
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        for n in itertools.count(1):
            path = Path(root) / (f"{stamp}-{name}" if n == 1 else f"{stamp}-{name}-{n}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            try:
                return _locked_marker(path)
            except OSError:
                path.rmdir()
                raise
    except OSError as exc:
        where = Path(root).resolve()
        why = "is not a directory" if exc.errno in (errno.EEXIST, errno.ENOTDIR) else (exc.strerror or str(exc))
        raise RunDirError(f"cannot make a run directory under {where}: {why}") from None
    raise AssertionError("unreachable")


def _created_at(path: Path) -> tuple[int, str] | None:
    """(marker mtime in ns, name) of a default run directory, None for anything else (symlinks included)."""
    try:
        if path.is_symlink() or not path.is_dir():
            return None
        marker = path / CREATED_MARKER
        if marker.is_symlink():
            return None
        return marker.stat().st_mtime_ns, path.name
    except OSError:
        return None


def _remove_unless_live(path: Path) -> bool:
    """Remove the default run directory `path` unless its launcher still holds its lock; True if it is gone."""
    try:
        handle = open(path / CREATED_MARKER, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # live (or unlockable): never removed
        shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def sweep_old_runs(root: Path | str, keep: int) -> list[Path]:
    """Remove the oldest finished default run directories under `root` (module doc: live runs and
    directories geotrain did not make are never touched) so that at most `keep` remain, live ones counted;
    returns those actually removed."""
    root = Path(root)
    try:
        entries = list(root.iterdir()) if root.is_dir() and not root.is_symlink() else []
    except OSError:
        return []
    runs = sorted((key, p) for p in entries if (key := _created_at(p)) is not None)
    excess = len(runs) - keep
    removed: list[Path] = []
    for _, path in runs:
        if len(removed) >= excess:
            break
        if _remove_unless_live(path):
            removed.append(path)
    return removed


def check_run_dir(path: Path | str) -> None:
    """RunDirError if `path` is empty text (an unset shell variable: it would be the working directory), a
    file, or already holds a run's metrics (two runs' lines would mix)."""
    if isinstance(path, str) and not path.strip():
        raise RunDirError(f"--run-dir: an empty path (an unset variable?): name a directory, or '{NO_RUN_DIR}' "
                          "for no run directory")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--run-dir {path}: is a file, not a directory")
    try:
        held = (path / "metrics").is_dir() and any((path / "metrics").iterdir())
    except OSError as exc:
        raise RunDirError(f"--run-dir {path}: cannot read it: {exc.strerror or exc}") from None
    if held:
        raise RunDirError(f"--run-dir {path}: already holds a run's metrics (choose a new directory or remove it)")


def prepare_run_dir(path: Path | str, about: dict[str, Any]) -> Path:
    """Make `path` (parents too) and write its RUN_MARKER with `about` (plan, cluster, layout...), after
    `check_run_dir`."""
    check_run_dir(path)
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / RUN_MARKER).write_text(json.dumps(about, indent=1))
    except OSError as exc:
        raise RunDirError(f"--run-dir {path}: cannot write there: {exc.strerror or exc}") from None
    return path


def read_about(path: Path | str) -> tuple[dict[str, Any], str | None]:
    """The RUN_MARKER of a run directory and a note when it is absent or unreadable ({} then): not UTF-8,
    not JSON, not a JSON object, not a file."""
    marker = Path(path) / RUN_MARKER
    if not marker.exists():
        return {}, f"{RUN_MARKER}: missing"
    try:
        if not marker.is_file():
            return {}, f"{RUN_MARKER}: not a file"
        about = json.loads(marker.read_bytes().decode("utf-8"))
    except OSError as exc:
        return {}, f"{RUN_MARKER}: unreadable ({exc.strerror or exc})"
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}, f"{RUN_MARKER}: not valid JSON (ignored)"
    if not isinstance(about, dict):
        return {}, f"{RUN_MARKER}: not a JSON object (ignored)"
    return about, None
