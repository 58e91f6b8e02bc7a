"""Process-tree helpers for tests that check that nothing is left running (Linux /proc), and for tests
that send signals to the processes they start."""

from __future__ import annotations

import signal
from pathlib import Path


def default_signals() -> None:
    """`preexec_fn` for a process a test will send Ctrl-C (SIGINT) or SIGQUIT: a shell starts a
    background job (`make test &`, nohup, many CI runners) with both ignored, an ignored signal stays
    ignored across fork and exec, and geotrain rightly keeps an inherited ignore. The test's own process
    starts as a terminal's foreground job would."""
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def descendants(root: int) -> set[int]:
    """Pids of every live descendant of `root` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
