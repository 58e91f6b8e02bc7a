"""`NetLab`: a cluster's devices as network namespaces joined by really shaped links, on this machine.

    with NetLab(cluster, devices=[0, 1, 8, 9]) as lab:
        worker = lab.run(0, [sys.executable, "worker.py"], env)   # a Popen inside rank 0's namespace
        ...

Everything the lab creates (namespaces, bridges, veths, qdiscs, the processes it started) is removed
when the `with` block ends, when it raises, on SIGINT/SIGTERM/SIGHUP (turned into exceptions while the
lab is up, so that the `with` block unwinds) and at interpreter exit (atexit). A SIGKILLed owner
cannot clean up: its workers die with it (PR_SET_PDEATHSIG) and its guardian (geotrain.procs.guardian)
runs `geotrain netlab down --all`, which kills whatever still runs in the namespaces of labs whose owner
is dead and removes them; should that fail too, the namespaces, recognisable by the owner's dead pid in
their names, are removed by the next lab that starts (`sweep_stale=True`) or by `netlab down --all`.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Collection, Mapping, Sequence
from types import FrameType
from typing import Any

from geotrain.cluster import Cluster
from geotrain.netlab.build import build_lab, check_can_build, destroy_namespaces
from geotrain.netlab.names import lab_namespaces, new_lab_name, owner_alive
from geotrain.netlab.cuts import set_cut
from geotrain.netlab.processes import popen_in_namespace, stop_process
from geotrain.netlab.topology import LabDevice, LabTopology, NetLabError, lab_topology
from geotrain.procs.guardian import Guardian

_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class LabSignal(SystemExit):
    """Raised in the lab owner's main thread when SIGTERM/SIGHUP arrives while a lab is up."""


def sweep_stale_labs(include_live: bool = False) -> list[str]:
    """Remove the namespaces of every lab whose owner process is gone (all labs if `include_live`);
    returns the namespaces removed. Raises NetLabError listing what could not be removed."""
    removed, problems = [], []
    for lab, names in lab_namespaces().items():
        if lab.pid == os.getpid() or (owner_alive(lab) and not include_live):
            continue
        problems += destroy_namespaces(names)
        removed += names
    if problems:
        raise NetLabError("netlab: could not remove all leftovers: " + "; ".join(problems))
    return removed


class NetLab:
    """Shaped network namespaces for `devices` (rank i = cluster device devices[i]) of `cluster`."""

    def __init__(self, cluster: Cluster, devices: Sequence[int], *, nic_gbps: float | Sequence[float] | None = None,
                 sweep_stale: bool = True) -> None:
        """`nic_gbps`: each rank's total outgoing rate (one value, or one per rank); None: unlimited."""
        nic = nic_gbps if nic_gbps is None or isinstance(nic_gbps, (int, float)) else list(nic_gbps)
        self.topology: LabTopology = lab_topology(cluster, list(devices), new_lab_name(), nic)
        self.latency_shaped = False
        self.swept: list[str] = []
        self._sweep_stale = sweep_stale
        self._created: list[str] = []
        self._processes: list[subprocess.Popen] = []
        self._old_handlers: dict[int, Any] = {}
        self._owner_pid = os.getpid()
        self._guardian: Guardian | None = None
        self._up = False
        self._cut: frozenset[int] = frozenset()

    @property
    def devices(self) -> tuple[LabDevice, ...]:
        return self.topology.devices

    @property
    def prefix(self) -> str:
        return self.topology.lab.prefix

    @property
    def control_address(self) -> str:
        """The lab namespace's own address, reachable from every device not cut off (netlab.cuts)."""
        return self.topology.control_address

    def set_cut(self, sites: Collection[Collection[int]]) -> None:
        """Cut each of `sites` (a set of lab ranks) off from every other address of the lab, the links inside it
        left up, and heal every other cut (netlab.cuts)."""
        for rank in (rank for site in sites for rank in site):
            self._check_rank(rank)
        self._cut = set_cut(self.topology, sites, self._cut)

    def _check_rank(self, rank: int) -> None:
        if not self._up:
            raise NetLabError("netlab: the lab is not up (use `with NetLab(...) as lab:`)")
        if not 0 <= rank < len(self.devices):
            raise NetLabError(f"netlab: rank must be in 0..{len(self.devices) - 1}, got {rank}")

    def __enter__(self) -> NetLab:
        self.up()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        problems = self.down()
        if problems and exc_type is None:
            raise NetLabError("netlab: teardown left something behind: " + "; ".join(problems))

    def up(self) -> None:
        """Build the lab (sweeping stale labs first); on any failure, remove what was built and raise."""
        if self._up:
            return
        check_can_build()
        if self._sweep_stale:
            self.swept = sweep_stale_labs()
        self._up = True
        atexit.register(self.down)
        self._install_signal_handlers()
        # Should this process be SIGKILLed, the guardian kills what runs in the lab and removes it.
        self._guardian = Guardian()
        self._guardian.tell("exec", json.dumps([sys.executable, "-m", "geotrain", "netlab", "down", "--all"]))
        # Signals are held during the build and acted on when it ends (seconds): one arriving inside a
        # pyroute2 call could leave a namespace its helper process finishes after the teardown ran.
        blocked = _block_signals()
        try:
            try:
                self.latency_shaped = build_lab(self.topology, self._created)
            finally:
                _unblock_signals(blocked)  # a signal held meanwhile is raised here
        except BaseException:
            self.down()
            raise

    def run(self, rank: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
            **popen_kwargs: Any) -> subprocess.Popen:
        """Start `argv` inside rank `rank`'s namespace; the lab stops it at teardown."""
        self._check_rank(rank)
        process = popen_in_namespace(self.devices[rank].namespace, argv, env, **popen_kwargs)
        self._processes.append(process)
        return process

    def down(self) -> list[str]:
        """Stop the lab's processes and remove all it built; idempotent. Returns problems (empty: clean).

        A no-op in a forked child (pyroute2 forks helpers; a child unwinding a copy of the owner's
        stack, or running its atexit hooks, must not tear down the owner's lab)."""
        if not self._up or os.getpid() != self._owner_pid:
            return []
        blocked = _block_signals()
        try:
            for process in self._processes:
                stop_process(process)
            problems = destroy_namespaces(reversed(self._created))
            self._created.clear()
            self._cut = frozenset()
            self._processes.clear()
            self._restore_signal_handlers()
            atexit.unregister(self.down)
            if self._guardian is not None:
                self._guardian.close(release=True)
                self._guardian = None
            self._up = False
        finally:
            _unblock_signals(blocked)
        return problems

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set there; atexit and `with` still clean up
        owner = self._owner_pid

        def raise_on_signal(signum: int, frame: FrameType | None) -> None:
            if os.getpid() != owner:  # a forked helper: die as the signal says, unwind nothing
                os._exit(128 + signum)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise LabSignal(128 + signum)

        for sig in _HANDLED_SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, raise_on_signal)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()


def _block_signals() -> set[int]:
    """Hold SIGINT/SIGTERM/SIGHUP back during teardown, so a second Ctrl-C cannot cut it short."""
    if threading.current_thread() is not threading.main_thread():
        return set()
    return signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED_SIGNALS)


def _unblock_signals(previous: set[int]) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
