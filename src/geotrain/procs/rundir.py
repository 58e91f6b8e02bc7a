"""One run directory per launcher process: every temporary file of a run lives under it.

    <system temp>/geotrain-runs/<launcher pid>-<random>/   (TMPDIR of the launcher and its children)
        geotrain-run-*, geotrain-pg-*, geotrain-emulate-*   the launchers' own folders
        pymp-*                                              multiprocessing's (fork-server socket)
        torchinductor/                                      torch's compile cache (TORCHINDUCTOR_CACHE_DIR)

The launcher removes it at exit (after multiprocessing's own clean-up, which needs it); a launcher
that was SIGKILLed cannot, so every run first removes the run directories whose pid is dead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import util as mp_util
from pathlib import Path

from geotrain.procs.lifeline import pid_alive

RUNS_DIR = "geotrain-runs"
RUN_DIR_ENV = "GEOTRAIN_RUN_DIR"
# multiprocessing removes its pymp-* folder with a finalizer of this priority at exit; ours, made
# earlier with the same priority, runs after it (equal priorities run newest first).
_FINALIZER_PRIORITY = -100
# multiprocessing's fork-server socket is <temp>/pymp-XXXXXXXX/listener-XXXXXXXX and a Unix socket
# path has at most 107 bytes: with a longer run directory, only the inductor cache moves into it.
_MAX_TEMP_PATH = 107 - len("/pymp-XXXXXXXX/listener-XXXXXXXX") - 8


def sweep_stale_run_dirs(root: Path) -> list[Path]:
    """Remove the run directories under `root` whose launcher pid is dead; returns them."""
    removed = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return removed
    for entry in entries:
        pid = entry.name.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    try:
        path.parent.rmdir()  # the last run leaves the temp dir as it found it
    except OSError:
        pass


def current_run_dir() -> Path | None:
    """This process's run directory while `run_directory` is active, else None."""
    value = os.environ.get(RUN_DIR_ENV)
    path = None if value is None else Path(value)
    return path if path is not None and path.name.startswith(f"{os.getpid()}-") else None


@contextmanager
def run_directory(base: Path | None = None) -> Iterator[Path]:
    """Make this process's run directory (under `base`, default the system temp dir), sweep stale
    ones, and point TMPDIR, tempfile and the inductor cache of this process and its children at it
    while the block runs. Call it once, at a program's entry, before any process is started."""
    root = Path(tempfile.gettempdir() if base is None else base) / RUNS_DIR
    root.mkdir(mode=0o700, exist_ok=True)
    sweep_stale_run_dirs(root)
    path = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))
    mp_util.Finalize(None, _remove, args=(path,), exitpriority=_FINALIZER_PRIORITY)
    saved = {key: os.environ.get(key) for key in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR", RUN_DIR_ENV)}
    saved_tempdir = tempfile.tempdir
    os.environ[RUN_DIR_ENV] = str(path)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path / "torchinductor")
    if len(str(path)) <= _MAX_TEMP_PATH:  # else the fork server's socket path would be too long
        os.environ["TMPDIR"] = str(path)
        tempfile.tempdir = str(path)
    try:
        yield path
    finally:
        tempfile.tempdir = saved_tempdir
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
