"""One run directory per launcher process: every temporary file of a run lives under it.

    <system temp>/geotrain-runs/<launcher pid>-<random>/   (TMPDIR of the launcher and its children)
        geotrain-run-*, geotrain-pg-*, geotrain-emulate-*   the launchers' own folders
        pymp-*                                              multiprocessing's (fork-server socket)
        torchinductor/                                      torch's compile cache (TORCHINDUCTOR_CACHE_DIR)

The launcher removes it at exit (after multiprocessing's own clean-up, which needs it); a launcher
that was SIGKILLed cannot, so its guardian does, and every run first removes the run directories
whose pid is dead. Where the run directory's path is too long for the fork server's socket,
multiprocessing's pymp-* folder stays in the system temp dir: the run makes it at once and records
its path in the run directory (PYMP_RECORD), and whoever removes the run directory removes it too.
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
# in a run directory: the path of the run's pymp-* folder where it lies outside the run directory
PYMP_RECORD = "pymp-outside"


def sweep_stale_run_dirs(root: Path) -> list[Path]:
    """Remove the run directories under `root` whose launcher pid is dead; returns them."""
    removed = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return removed
    for entry in entries:
        pid = entry.name.split("-", 1)[0]
        # isdigit alone takes '²', which int() refuses
        if pid.isascii() and pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            for path in run_paths(entry):
                shutil.rmtree(path, ignore_errors=True)
            removed.append(entry)
    return removed


def run_paths(run_dir: Path) -> list[Path]:
    """What removing `run_dir` means: the run directory and, where it lies outside, the pymp-* folder
    recorded in it (the record is read first: it goes with the directory)."""
    try:
        recorded = Path((run_dir / PYMP_RECORD).read_text())
    except OSError:
        return [run_dir]
    return [*([recorded] if recorded.name.startswith("pymp-") else []), run_dir]


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)  # an outside pymp-* is multiprocessing's to remove at exit
    try:
        path.parent.rmdir()  # the last run leaves the temp dir as it found it
    except OSError:
        pass


def current_run_dir() -> Path | None:
    """This process's run directory while `run_directory` is active, else None."""
    value = os.environ.get(RUN_DIR_ENV)
    path = None if value is None else Path(value)
    return path if path is not None and path.name.startswith(f"{os.getpid()}-") else None


MAKE_TRIES = 5
"""How many times a run directory is tried before the error is raised (a concurrent run's exit removes an empty
`root` between its mkdir and the mkdtemp inside it: `_remove`)."""


def _new_run_dir(root: Path) -> Path:
    """This process's new run directory under `root` (made if missing), after sweeping stale ones."""
    for _ in range(MAKE_TRIES - 1):
        try:
            return _make_run_dir(root)
        except FileNotFoundError:  # another run's exit took the empty root away meanwhile (_remove): again
            continue
    return _make_run_dir(root)


def _make_run_dir(root: Path) -> Path:
    root.mkdir(mode=0o700, exist_ok=True)
    sweep_stale_run_dirs(root)
    return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))


@contextmanager
def run_directory(base: Path | None = None) -> Iterator[Path]:
    """Make this process's run directory (under `base`, default the system temp dir), sweep stale
    ones, and point TMPDIR, tempfile and the inductor cache of this process and its children at it
    while the block runs. Call it once, at a program's entry, before any process is started."""
    root = Path(tempfile.gettempdir() if base is None else base) / RUNS_DIR
    path = _new_run_dir(root)
    mp_util.Finalize(None, _remove, args=(path,), exitpriority=_FINALIZER_PRIORITY)
    saved = {key: os.environ.get(key) for key in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR", RUN_DIR_ENV)}
    saved_tempdir = tempfile.tempdir
    os.environ[RUN_DIR_ENV] = str(path)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path / "torchinductor")
    if len(str(path)) <= _MAX_TEMP_PATH:  # else the fork server's socket path would be too long
        os.environ["TMPDIR"] = str(path)
        tempfile.tempdir = str(path)
    else:  # multiprocessing's folder, made now (it would be at the first pool), where a sweep finds it
        (path / PYMP_RECORD).write_text(mp_util.get_temp_dir())
    try:
        yield path
    finally:
        tempfile.tempdir = saved_tempdir
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
