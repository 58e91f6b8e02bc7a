"""Lab names: every namespace a lab creates is called `gt<pid>-<tag>-<role>`.

The owner's process id in the name lets a later lab (or `geotrain netlab down --all`) recognise the
leftovers of a lab whose owner died (SIGKILL, power loss) without any state file; the random tag keeps
two labs of one process apart. Interfaces need no prefix: they exist only inside the lab's own
namespaces, where no other lab or program can see them.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass

from geotrain.procs.lifeline import pid_alive

NETNS_DIR = "/var/run/netns"
_LAB_NAME = re.compile(r"^gt(?P<pid>\d+)-(?P<tag>[0-9a-f]{4})-(?P<role>[a-z0-9]+)$")


@dataclass(frozen=True)
class LabName:
    """The prefix shared by one lab's namespaces, e.g. `gt4242-9f3a`."""

    pid: int
    tag: str

    @property
    def prefix(self) -> str:
        return f"gt{self.pid}-{self.tag}"

    def namespace(self, role: str) -> str:
        """Namespace name for `role` ("lab" for the bridges, "d<i>" for lab device i)."""
        return f"{self.prefix}-{role}"


def new_lab_name(pid: int | None = None) -> LabName:
    """A fresh name owned by `pid` (default: this process)."""
    return LabName(pid=os.getpid() if pid is None else pid, tag=secrets.token_hex(2))


def parse_namespace(name: str) -> tuple[LabName, str] | None:
    """(lab, role) of a namespace created by a lab, else None (not ours: never touch it)."""
    match = _LAB_NAME.match(name)
    if match is None:
        return None
    return LabName(pid=int(match["pid"]), tag=match["tag"]), match["role"]


def lab_namespaces(netns_dir: str = NETNS_DIR) -> dict[LabName, list[str]]:
    """Every lab namespace present on this machine, grouped by lab."""
    try:
        names = sorted(os.listdir(netns_dir))
    except FileNotFoundError:
        return {}
    labs: dict[LabName, list[str]] = {}
    for name in names:
        parsed = parse_namespace(name)
        if parsed is not None:
            labs.setdefault(parsed[0], []).append(name)
    return labs


def owner_alive(lab: LabName) -> bool:
    """True while the process that created `lab` still runs (a zombie owner, killed but not yet
    reaped, is dead: its guardian cleans up at that very moment)."""
    return pid_alive(lab.pid)
