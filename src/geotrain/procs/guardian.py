"""The guardian: a tiny process that outlives a SIGKILLed launcher just long enough to clean up after it.

A launcher that is SIGKILLed runs no code of its own: its ranks die with it (PR_SET_PDEATHSIG and the
lifeline thread of geotrain.procs.lifeline), but a rank's own children, started by the user's script,
do not, and temporary folders stay. So each supervisor starts one guardian (`python -I -S guardian.py`,
stdlib only, in a session of its own so that a Ctrl-C to the launcher's group spares it) and tells it,
one line per fact on the guardian's stdin:

    group PGID      a rank's process group: SIGKILLed when the launcher goes
    path DIR        a folder: removed when the launcher goes
    exec JSON-ARGV  a program to run (bounded to 60 s) when the launcher goes, after the kills
    release         the launcher cleaned up itself: forget everything

The kernel closes the pipe when the launcher exits in any way, SIGKILL included; at end of file the
guardian acts on what it was told and exits.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

_EXEC_TIMEOUT_S = 60.0


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def guard(commands: IO[str]) -> None:
    """Read facts from `commands` until end of file, then kill, run and remove what is left."""
    groups: list[int] = []
    programs: list[list[str]] = []
    paths: list[str] = []
    for line in commands:
        verb, _, arg = line.strip().partition(" ")
        if verb == "group":
            groups.append(int(arg))
        elif verb == "exec":
            programs.append(json.loads(arg))
        elif verb == "path":
            paths.append(arg)
        elif verb == "release":
            groups, programs, paths = [], [], []
    for pgid in groups:
        _kill_group(pgid)
    for argv in programs:
        try:
            subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=_EXEC_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


class Guardian:
    """The launcher's side: start the guardian, tell it facts, release it at an orderly end."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(__file__).resolve())], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, text=True)

    @property
    def pid(self) -> int:
        return self._process.pid

    def tell(self, verb: str, arg: str = "") -> None:
        """Send one fact (see the module docstring); a guardian that is gone is ignored."""
        stdin = self._process.stdin
        if stdin is None or stdin.closed:
            return
        try:
            stdin.write(f"{verb} {arg}\n")
            stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def close(self, release: bool = True) -> None:
        """End the guardian: `release` first tells it that everything is cleaned up already."""
        if release:
            self.tell("release")
        if self._process.stdin is not None and not self._process.stdin.closed:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        try:
            self._process.wait(timeout=_EXEC_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only end of file ends a guardian
    guard(sys.stdin)
