"""Processes inside a lab namespace: start them there, and find and stop whatever runs there.

A child enters its device's namespace between fork and exec (pyroute2's `setns` on a descriptor the
parent opened), starts its own session (so a group signal reaches its children too) and asks the
kernel to SIGKILL it if the lab's owner dies (PR_SET_PDEATHSIG), so that even a SIGKILLed owner
leaves no worker behind. Whatever still lives in a namespace at teardown is found through
/proc/<pid>/ns/net and killed before the namespace is removed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pyroute2.netns import setns

from geotrain.netlab.names import NETNS_DIR

_PR_SET_PDEATHSIG = 1


def _enter_namespace(ns_fd: int, parent_pid: int) -> None:
    """preexec_fn: runs in the child after fork, before exec."""
    setns(ns_fd, flags=0)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the owner died before prctl: do not outlive it
        os._exit(1)


def popen_in_namespace(namespace: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
                       **popen_kwargs: Any) -> subprocess.Popen:
    """Start `argv` inside network namespace `namespace` (a name under /var/run/netns)."""
    ns_fd = os.open(os.path.join(NETNS_DIR, namespace), os.O_RDONLY)
    parent = os.getpid()
    try:
        return subprocess.Popen(list(argv), env=None if env is None else dict(env), start_new_session=True,
                                preexec_fn=lambda: _enter_namespace(ns_fd, parent), **popen_kwargs)
    finally:
        os.close(ns_fd)


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
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if process.poll() is not None:
            break
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return process.wait()


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
