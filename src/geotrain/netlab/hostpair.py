"""Two "hosts" on one machine: two network namespaces joined by one veth pair (real TCP between them).

    with HostPair() as pair:
        a = pair.run(0, [sys.executable, "-m", "geotrain", "train", ..., "--rdzv", f"{pair.addresses[0]}:29500"], env)

Host i has interface `pair.ifnames[i]` with address `pair.addresses[i]` (/24) and its own loopback;
nothing is shaped (the link runs at veth speed). Namespaces are named like a NetLab's
(`gt<pid>-<tag>-hosta|hostb`), so the leftovers of a SIGKILLed owner are swept like a lab's. On exit of
the `with` block, normal or not, the processes started inside are stopped and both namespaces removed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from pyroute2 import IPRoute, netns

from geotrain.netlab.build import check_can_build, destroy_namespaces
from geotrain.netlab.names import new_lab_name
from geotrain.netlab.processes import popen_in_namespace, stop_process
from geotrain.netlab.topology import NetLabError

ADDRESSES = ("10.213.0.1", "10.213.0.2")
IFNAMES = ("gth0", "gth1")
PREFIX_LEN = 24


class HostPair:
    """Two namespaces ("hosta", "hostb") with one veth pair between them."""

    def __init__(self) -> None:
        name = new_lab_name()
        self.namespaces = (name.namespace("hosta"), name.namespace("hostb"))
        self.addresses = ADDRESSES
        self.ifnames = IFNAMES
        self._created: list[str] = []
        self._processes: list[subprocess.Popen] = []

    def __enter__(self) -> HostPair:
        check_can_build()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _build(self) -> None:
        for namespace in self.namespaces:
            netns.create(namespace)
            self._created.append(namespace)
        with IPRoute(netns=self.namespaces[0], flags=0) as ipr:
            ipr.link("add", ifname=IFNAMES[0], kind="veth", peer={"ifname": IFNAMES[1], "net_ns_fd": self.namespaces[1]})
        for namespace, ifname, address in zip(self.namespaces, IFNAMES, ADDRESSES):
            with IPRoute(netns=namespace, flags=0) as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
                index = ipr.link_lookup(ifname=ifname)[0]
                ipr.addr("add", index=index, address=address, prefixlen=PREFIX_LEN)
                ipr.link("set", index=index, state="up")

    def run(self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None, **popen_kwargs: Any) -> subprocess.Popen:
        """Start `argv` inside host `host` (0 or 1); it is stopped when the pair closes."""
        process = popen_in_namespace(self.namespaces[host], argv, env, **popen_kwargs)
        self._processes.append(process)
        return process

    def close(self) -> None:
        """Stop the processes started here and remove both namespaces; NetLabError if one stays."""
        for process in self._processes:
            stop_process(process)
        self._processes.clear()
        problems = destroy_namespaces(self._created)
        self._created.clear()
        if problems:
            raise NetLabError("host pair: could not remove all namespaces: " + "; ".join(problems))
