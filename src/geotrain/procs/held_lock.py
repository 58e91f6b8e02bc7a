"""A lock a process holds on a file with flock: the one shape of geotrain's directory locks.

The kernel drops an flock when its file is closed or its process ends, however it ends (SIGKILL included), so a
lock never outlives its holder. Used by the checkpoint directory's lock (runtime/checkpoint_lock.py) and the
default run directory's (observe/rundir.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass
class HeldLock:
    """The held flock of `path` (a context manager; `release` is idempotent)."""

    path: Path
    _handle: IO[bytes] | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file drops the flock
            self._handle = None

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
