"""A hard time limit for work that may overrun its own (HiGHS can, and model building is not timed).

`run_with_deadline(target, args, time_limit_s)` runs `target(report, *args)` in a child Python
process (a fresh interpreter, `subprocess`); `report(item)` sends a picklable item to the parent at once, so whatever the child proved
before the limit survives it. The parent waits until the child returns (its return value is the
last item) or the wall-clock limit plus `grace_s` passes, then terminates it (SIGTERM, then
SIGKILL). A fresh interpreter, not a fork: HiGHS's thread pool in the parent cannot deadlock it (fork
would copy a pool without its threads), and unlike multiprocessing's spawn it does not re-import
the caller's __main__. Its start-up (imports, ~1 s) is inside the limit; the child is told its
limit as an absolute wall-clock deadline.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from geotrain.procs import Command, spawn, stop_tree

GRACE_S = 0.5
"""Seconds the child may run past its limit before it is killed (it normally stops on its own)."""

CANCEL_POLL_S = 0.1
"""How often a run with a `cancel` event looks at it (seconds)."""


@dataclass(frozen=True)
class GuardedRun:
    """items: everything the child reported, in order (its return value last when finished);
    finished: the child returned; killed: the parent had to end it; seconds: wall time."""

    items: tuple[Any, ...]
    finished: bool
    killed: bool
    seconds: float


_CHILD = ("import os, pickle, sys; sys.path[:0] = pickle.load(sys.stdin.buffer); "
          "from geotrain.search.watchdog import _serve; _serve()")


def _serve() -> None:
    """The child's side: read (target, args) from stdin, run it, stream each reported item to the
    parent as a length-prefixed pickle (`_send`), the return value last as ("done", value). File
    descriptor 1 goes to /dev/null first, so solver prints cannot corrupt the stream."""
    channel = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    target, args = pickle.load(sys.stdin.buffer)

    def send(item: Any) -> None:
        data = pickle.dumps(item)
        channel.write(struct.pack("<Q", len(data)) + data)
        channel.flush()

    send(("done", target(lambda item: send(("item", item)), *args)))


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def run_with_deadline(target: Callable[..., Any], args: tuple[Any, ...], time_limit_s: float,
                      grace_s: float = GRACE_S, cancel: threading.Event | None = None) -> GuardedRun:
    """Run target(report, *args) in a child process for at most time_limit_s + grace_s seconds
    (wall clock, start-up included); see the module docstring. `target` must be importable
    (module level) and `args` picklable. `cancel`: once set (by another thread), the child is ended
    as at the limit (within CANCEL_POLL_S), keeping what it reported."""
    start = time.monotonic()
    # started like every process geotrain starts: its own session, dying with this process
    process = spawn(Command((sys.executable, "-c", _CHILD)), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(pickle.dumps(list(sys.path)) + pickle.dumps((target, args)))
    process.stdin.close()
    fd = process.stdout.fileno()
    items: list[Any] = []
    finished = False
    deadline = start + time_limit_s + grace_s
    while not finished:
        left = deadline - time.monotonic()
        if left <= 0 or (cancel is not None and cancel.is_set()):
            break
        if not select.select([fd], [], [], left if cancel is None else min(left, CANCEL_POLL_S))[0]:
            continue
        header = _read_exact(fd, 8)
        data = None if header is None else _read_exact(fd, struct.unpack("<Q", header)[0])
        if data is None:  # the child ended without returning
            break
        kind, item = pickle.loads(data)
        items.append(item)
        finished = kind == "done"
    killed = process.poll() is None and not finished
    if killed:
        stop_tree(process, term_s=0.5)
    try:
        process.wait(1.0)
    except subprocess.TimeoutExpired:
        stop_tree(process, term_s=0.0)
    process.stdout.close()
    return GuardedRun(tuple(items), finished, killed, time.monotonic() - start)
