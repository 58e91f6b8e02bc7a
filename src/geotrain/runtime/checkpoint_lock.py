"""One run per checkpoint directory: an advisory lock held by the launcher for the run's life.

`hold_directory(D)` creates D if needed, opens D/.geotrain-lock and takes an exclusive
`fcntl.flock` on it without waiting; the file then holds the holder's pid and host (for the
message a second run gets). The kernel drops the lock when the holder exits, however it ends
(SIGKILL included), so a stale file never blocks anyone: the next run takes the lock and rewrites
it. flock locks are per open file, so a second run in the same process is refused as well.

Holding the lock, the launcher removes what an interrupted checkpoint left behind (temporary
files of a write that never reached its rename: a SIGKILL or a full disk mid-write); it must not do
so without the lock, since they may be another live run's writes in progress.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from geotrain.procs.held_lock import HeldLock
from geotrain.runtime.checkpoint import STEP_NAME, CheckpointError

LOCK_FILE = ".geotrain-lock"
# `_atomic_write`'s temporary names (.NAME.tmp-PID) and `prepare_directory`'s write probe.
_PARTIAL = re.compile(r"\.(.+\.tmp-\d+|geotrain-write-test-\d+)")


@dataclass
class DirectoryLock(HeldLock):
    """The held lock of a checkpoint directory and the partial files removed when it was taken."""

    removed: tuple[str, ...] = ()


def _holder(lock_path: Path) -> str:
    """Who holds `lock_path`, as its file says ("pid 123 on host h"), or a plain "another process"."""
    try:
        text = lock_path.read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        text = []
    if len(text) >= 2 and text[0].isdigit():
        return f"pid {text[0]} on host {text[1][:64]}"
    return "another process (it has not written its pid yet)"


def remove_partial_files(root: str | Path) -> tuple[str, ...]:
    """Remove the temporary files of interrupted writes in `root` and its step-* directories;
    their paths relative to `root`, sorted. Call only while holding `root`'s lock."""
    root = Path(root)
    folders = [root] + [entry for entry in root.iterdir()
                        if STEP_NAME.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink()]
    removed = []
    for folder in folders:
        for entry in folder.iterdir():
            if _PARTIAL.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink():
                entry.unlink(missing_ok=True)
                removed.append(str(entry.relative_to(root)))
    return tuple(sorted(removed))


def hold_directory(root: str | Path) -> DirectoryLock:
    """Take `root`'s lock (creating `root`) for this run, then remove partial files of interrupted
    checkpoints; CheckpointError naming the holder if another live run has it."""
    path = Path(root)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path}: --checkpoint-dir exists and is not a directory")
    lock_path = path / LOCK_FILE
    try:
        path.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a+b")  # noqa: SIM115 - held open for the run's life
    except OSError as exc:
        raise CheckpointError(f"{path}: --checkpoint-dir is not writable ({exc.strerror or exc})") from None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise CheckpointError(f"{lock_path}: cannot lock the checkpoint directory ({exc.strerror or exc})") from None
        raise CheckpointError(f"{path}: --checkpoint-dir is in use by another run ({_holder(lock_path)}); "
                              f"wait for it to end or choose another directory") from None
    handle.truncate(0)
    handle.write(f"{os.getpid()} {socket.gethostname()}\n".encode())
    handle.flush()
    lock = DirectoryLock(path, _handle=handle)
    try:
        lock.removed = remove_partial_files(path)
    except OSError as exc:
        lock.release()
        raise CheckpointError(f"{path}: cannot clean up the checkpoint directory ({exc.strerror or exc})") from None
    return lock
