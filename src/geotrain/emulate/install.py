"""`install(cluster, devices)`: make this process's `init_process_group("gloo")` emulate the cluster.

Registers the emulating backend with torch (extended API, cpu) and wraps torch.distributed's
`init_process_group` and `new_group` so that backend None, "gloo" or "cpu:gloo" becomes the emulating
one, as does the cpu entry of a per-device string ("cpu:gloo,cuda:nccl") (torch does not let a plugin
replace "gloo"), and `monitored_barrier` so that it works on it.
Rank r of the job emulates cluster device `devices[r]`. Call it before `init_process_group`.
"""

from __future__ import annotations

import atexit
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from geotrain.cluster import Cluster
from geotrain.cluster.devices import check_device_list
from geotrain.emulate.clock import RankClock
from geotrain.emulate.network import EmulatedNetwork, EmulationError
from geotrain.emulate.process_group import BACKEND_NAME, EmulatedProcessGroup
from geotrain.emulate.state import EmulationState

_GLOO_NAMES = (None, "", "gloo", "cpu:gloo", dist.Backend.GLOO)

COMPUTE_CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
"""How a rank's clock advances between operations: "wall" (real time: compute as slow as this machine is
now, shared cores included) or "cpu" (this process's CPU seconds: as if each rank had a core to itself,
so a loaded or oversubscribed machine does not slow the emulated compute)."""


@dataclass(frozen=True)
class Emulation:
    """What `install` set up: the network and devices; `state()` is this rank's (after init)."""

    network: EmulatedNetwork
    devices: tuple[int, ...]
    report_dir: Path | None
    _states: list[EmulationState]

    def state(self) -> EmulationState:
        if not self._states:
            raise EmulationError("geotrain.emulate: no emulated process group created yet (init_process_group)")
        return self._states[0]


def _swap(backend: Any) -> Any:
    """gloo -> the emulating backend; in a per-device string ("cpu:gloo,cuda:nccl") the cpu entry only
    (until the conformance work such a string silently got plain, un-emulated gloo)."""
    if backend in _GLOO_NAMES:
        return BACKEND_NAME
    parts = [part.strip() for part in backend.split(",")] if isinstance(backend, str) else []
    if "cpu:gloo" in parts:
        return ",".join(f"cpu:{BACKEND_NAME}" if part == "cpu:gloo" else part for part in parts)
    return backend


def _wrap_backend_arg(original: Callable[..., Any], on_return: Callable[[], None]) -> Callable[..., Any]:
    if getattr(original, "_geotrain_emulate", False):
        original = original.__wrapped__  # installed again: wrap the original, not our wrapper

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = _swap(kwargs["backend"])
        elif original.__name__ == "init_process_group":
            if args:
                args = (_swap(args[0]), *args[1:])
            else:
                kwargs["backend"] = BACKEND_NAME
        result = original(*args, **kwargs)
        on_return()
        return result
    wrapper._geotrain_emulate = True  # type: ignore[attr-defined]
    return wrapper


def _wrap_monitored_barrier(original: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(original, "_geotrain_emulate", False):
        original = original.__wrapped__

    @functools.wraps(original)
    def wrapper(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> Any:
        target = group if group is not None else c10d._get_default_group()
        if isinstance(target, EmulatedProcessGroup):
            return target.monitored_barrier(timeout, wait_all_ranks)
        return original(group, timeout, wait_all_ranks)
    wrapper._geotrain_emulate = True  # type: ignore[attr-defined]
    return wrapper


def _check_compute_scale(compute_scale: Sequence[float] | None, n_devices: int) -> tuple[float, ...]:
    if compute_scale is None:
        return (1.0,) * n_devices
    scales = tuple(compute_scale)
    ok = len(scales) == n_devices and all(
        isinstance(k, int | float) and not isinstance(k, bool) and math.isfinite(k) and k > 0 for k in scales)
    if not ok:
        raise EmulationError(f"geotrain.emulate: compute_scale must be {n_devices} finite factors > 0 (one per "
                             f"cluster device), got {list(scales)[:8]}")
    return tuple(float(k) for k in scales)


def install(cluster: Cluster, devices: Sequence[int], time_scale: float = 1.0,
            nic_gbps: float | Sequence[float] | None = None, report_dir: str | Path | None = None,
            compute_clock: str = "wall", compute_scale: Sequence[float] | None = None,
            clock: RankClock | None = None) -> Emulation:
    """Emulate `cluster` in this process: global rank r is device `devices[r]`; `time_scale` F sleeps F x
    the emulated link time (0: none); `report_dir` receives `rank-<r>.json` at exit; `compute_clock` one
    of COMPUTE_CLOCKS; `compute_scale` (one factor per cluster device, None: all 1): the rank on device d
    counts compute_scale[d] x its measured compute (a device that many times slower than this machine);
    `clock`: the process's emulated clock, shared with its other emulated groups (torchft's:
    geotrain.emulate.TorchftGroups; None: a new one from `time_scale`, `compute_clock` and `compute_scale`)."""
    if compute_clock not in COMPUTE_CLOCKS:
        raise EmulationError(f"geotrain.emulate: compute clock must be one of {', '.join(COMPUTE_CLOCKS)}, "
                             f"got {compute_clock!r}")
    network = EmulatedNetwork.from_cluster(cluster, time_scale, nic_gbps)
    device_list = tuple(check_device_list(devices, network.n_devices))
    scales = _check_compute_scale(compute_scale, network.n_devices)
    states: list[EmulationState] = []
    emulation = Emulation(network, device_list, Path(report_dir) if report_dir else None, states)

    def create(options: Any, _backend_options: Any) -> EmulatedProcessGroup:
        global_ranks = list(options.global_ranks_in_group) or list(range(options.group_size))
        if len(device_list) < (max(global_ranks) + 1):
            raise EmulationError(f"geotrain.emulate: {len(device_list)} devices given for a job of at least "
                                 f"{max(global_ranks) + 1} ranks")
        if not states:  # the default group: this process's rank, clock and records
            rank = global_ranks[options.group_rank]
            own = clock if clock is not None else RankClock(time_scale, wall=COMPUTE_CLOCKS[compute_clock],
                                                            compute_scale=scales[device_list[rank]])
            states.append(EmulationState(network, device_list, rank, own))
            if emulation.report_dir is not None:
                atexit.register(states[0].write_part, emulation.report_dir)
        store = dist.PrefixStore("geotrain-emulate-inner/", options.store)
        inner = dist.ProcessGroupGloo(store, options.group_rank, options.group_size, options.timeout)
        return EmulatedProcessGroup(inner, options.group_rank, options.group_size, global_ranks, states[0])

    def start_clock() -> None:
        # init_process_group ends with a store barrier: every rank leaves it at about the same moment,
        # so emulated time 0 is common to all ranks (and process start-up is not counted)
        if states:
            states[0].clock.restart(0.0)

    dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=["cpu"])
    for module in (dist, c10d):
        module.init_process_group = _wrap_backend_arg(module.init_process_group, start_clock)
        module.new_group = _wrap_backend_arg(module.new_group, lambda: None)
        module.monitored_barrier = _wrap_monitored_barrier(module.monitored_barrier)
    return emulation
