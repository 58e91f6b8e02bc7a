"""What every process geotrain starts shares: dying with the launcher, the fork-server context,
naming a failure.

Die with the launcher: every process geotrain starts calls `die_with_parent` first thing.

Two independent mechanisms, so that no worker, pool process or manager outlives whoever started it
(a launcher killed with SIGKILL by a caller's timeout cannot clean up after itself):
  1. Linux: prctl(PR_SET_PDEATHSIG, SIGKILL): the kernel kills this process when its parent exits.
     With a forkserver the parent is the fork server, not the launcher, hence 2.
  2. Everywhere: a daemon thread that waits on the launcher's pid (a pidfd on Linux, else polling
     every `poll_s` seconds, a zombie counting as dead) and on a change of this process's parent
     pid, and then SIGKILLs this process.
A multiprocessing fork server has no code of ours; it exits by itself once the launcher and every
worker it forked have closed its "alive" pipe, i.e. once they are dead. So is the resource tracker.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import select
import signal
import sys
import threading
from collections.abc import Sequence
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

from geotrain.errors import GeotrainError

PR_SET_PDEATHSIG = 1


def set_parent_death_signal() -> bool:
    """Ask the kernel for SIGKILL when the parent exits (Linux only); True if armed. Safe in a
    `preexec_fn` (no threads); `die_with_parent` adds the launcher watch after exec."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)
    return state not in ("Z", "X")


def descendant_named(name: str, root: int | None = None) -> int | None:
    """The pid of a live descendant of `root` (default: this process) whose process name (/proc/PID/comm,
    set by set_process_name) is `name`; None if there is none or no /proc."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                names[int(entry.name)] = (entry / "comm").read_text().strip()
            except (OSError, IndexError, ValueError):
                continue
    family, frontier = set(), {os.getpid() if root is None else root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - family
        family |= frontier
    return next((pid for pid in family if names.get(pid) == name and pid_alive(pid)), None)


def _kill_self() -> None:
    # A rank leads its own process group (geotrain.procs.supervisor): take its whole tree along.
    if os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _watch(launcher_pid: int, parent_pid: int, poll_s: float) -> None:
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(launcher_pid)
        except OSError:
            pidfd = None
    while True:
        if pidfd is not None:
            if select.select([pidfd], [], [], poll_s)[0]:  # readable: the launcher exited
                _kill_self()
        else:
            threading.Event().wait(poll_s)
            if not pid_alive(launcher_pid):
                _kill_self()
        if os.getppid() != parent_pid:  # re-parented: our parent died
            _kill_self()


def die_with_parent(launcher_pid: int | None = None, poll_s: float = 0.5) -> None:
    """Make this process die (SIGKILL) when its parent or `launcher_pid` (default: the parent) dies.
    Call it first thing in a child process; returns at once (the watch runs in a daemon thread)."""
    parent_pid = os.getppid()
    launcher_pid = parent_pid if launcher_pid is None else launcher_pid
    set_parent_death_signal()
    # The parent may have died before the signal was armed: check once now.
    if os.getppid() != parent_pid or not pid_alive(launcher_pid):
        _kill_self()
    threading.Thread(target=_watch, args=(launcher_pid, parent_pid, poll_s), name="geotrain-lifeline",
                     daemon=True).start()


class WorkerFailure(GeotrainError, RuntimeError):
    """A worker process died, hung, overran a time limit or failed; the message names it. Every other
    worker has been stopped when this is raised."""


def forkserver_context(preload: Sequence[str]) -> Any:
    """A multiprocessing context whose workers are forks of a server that has imported `preload`
    once (torch: seconds), started now so that it imports while the caller works; `spawn` where
    there is no fork server. The preload list only counts for the first server of this process."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    forkserver.ensure_running()
    return context


def describe_exit(exitcode: int | None) -> str:
    """'exited with status 3', 'killed by SIGKILL' or 'still running' for a process's exit code."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def set_process_name(name: str) -> None:
    """Show `name` in `ps`/`top` (Linux: /proc/self/comm, 15 characters); a no-op elsewhere."""
    try:
        with open("/proc/self/comm", "w") as handle:
            handle.write(name[:15])
    except OSError:
        pass
