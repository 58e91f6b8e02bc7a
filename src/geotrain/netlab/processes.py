"""Processes inside a lab namespace: start them there, and find and stop whatever runs there.

A child is started as every geotrain process (geotrain.procs.spawn: its own session, so a group
signal reaches its children too, and PR_SET_PDEATHSIG, so that even a SIGKILLed owner leaves no worker
behind) and enters its device's namespace between fork and exec (pyroute2's `setns`). Whatever still lives in a namespace at teardown is found through
/proc/<pid>/ns/net and killed before the namespace is removed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pyroute2.netns import setns

from geotrain.netlab.names import NETNS_DIR
from geotrain.procs import Command, spawn, stop_tree

def enter_namespace(namespace: str) -> Callable[[], None]:
    """A `preexec` (geotrain.procs.Command) that moves the child into network namespace `namespace`
    (a name under /var/run/netns) between fork and exec."""
    path = os.path.join(NETNS_DIR, namespace)

    def enter() -> None:
        ns_fd = os.open(path, os.O_RDONLY)
        try:
            setns(ns_fd, flags=0)
        finally:
            os.close(ns_fd)
    return enter


@contextlib.contextmanager
def thread_in_namespace(namespace: str) -> Iterator[None]:
    """Run the `with` block's calling thread inside network namespace `namespace`, then move it back.

    Sockets opened in the block (a TCPStore server and its client) stay in that namespace for their whole
    life, whichever thread uses them later; threads started in the block live there too."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        enter_namespace(namespace)()
        try:
            yield
        finally:
            setns(own, flags=0)
    finally:
        os.close(own)


def run_in_namespace(namespace: str, env: Mapping[str, str], target: Callable[..., Any], *args: Any) -> Any:
    """`target(*args)` inside network namespace `namespace` with `env` added to os.environ: the body of
    a function rank (geotrain.procs.Target) that must live in a lab device. Call it first thing in the
    new process, while it has one thread: threads it starts later inherit the namespace."""
    enter_namespace(namespace)()
    os.environ.update(env)
    return target(*args)


def popen_in_namespace(namespace: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
                       **popen_kwargs: Any) -> subprocess.Popen:
    """Start `argv` inside network namespace `namespace`, as a supervised rank is started
    (geotrain.procs.spawn: own session, dies with this process); stop it with `stop_process`."""
    return spawn(Command(tuple(argv), env, preexec=enter_namespace(namespace)), **popen_kwargs)


def pids_in_namespace(namespace: str) -> list[int]:
    """Process ids whose network namespace is `namespace` (empty if it does not exist)."""
    try:
        target = os.stat(os.path.join(NETNS_DIR, namespace))
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # exited meanwhile, or a kernel thread
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            pids.append(int(entry))
    return pids


def stop_process(process: subprocess.Popen, grace_s: float = 2.0) -> int:
    """SIGTERM the process's group, SIGKILL it after `grace_s`, reap it; returns its exit code."""
    return stop_tree(process, grace_s)


def kill_namespace_processes(namespace: str, timeout_s: float = 5.0) -> list[int]:
    """SIGKILL every process inside `namespace` and wait until none is left; returns the pids killed."""
    killed: list[int] = []
    me = os.getpid()
    deadline = time.monotonic() + timeout_s
    while True:
        pids = [pid for pid in pids_in_namespace(namespace) if pid != me]
        if not pids or time.monotonic() > deadline:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
