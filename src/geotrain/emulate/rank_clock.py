"""This rank's emulated clock as seen from a program that times itself (DiLoCo's adaptive local steps).

Under `geotrain emulate` every rank runs on this one machine, so wall seconds say how fast this machine is, not
the emulated device: with `--emulate-gpu-speed` a T4 rank computes as fast as an A100 rank in wall time. The
rank's emulated clock counts its compute at its device's speed (compute_scale x measured, clock.py) and its
collectives as the links emulate them; a program that measures seconds per step should read it instead.

The compute_scale applies to the loop only (emulate/clock.py, the start-up rule): set-up before the rank's first
operation counts at this machine's speed. `start_loop()` marks the loop's start where its first collective comes
late (local SGD: DiLoCo's block does), `host_work()` keeps set-up that runs collectives of its own at this
machine's speed (`geotrain train`'s workers). Both do nothing off the emulating backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from geotrain.emulate.process_group import EmulatedProcessGroup


def emulating_group(group: Any = None) -> EmulatedProcessGroup | None:
    """The emulating process group behind `group` (None: the default group) when it runs on the emulating backend
    (`geotrain emulate`, or `install` before `init_process_group`); None otherwise (no process group, plain gloo,
    NCCL)."""
    if not dist.is_initialized():
        return None
    target = group if group is not None else c10d._get_default_group()
    if isinstance(target, EmulatedProcessGroup):  # "gloo" or no backend: the group is the emulating one
        return target
    try:  # a per-device backend string ("cpu:gloo,cuda:nccl"): the cpu entry may be the emulating one
        cpu = target._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError):
        return None
    return cpu if isinstance(cpu, EmulatedProcessGroup) else None


def emulated_clock(group: Any = None) -> Callable[[], float] | None:
    """The function that reads this rank's emulated clock (seconds) when `group` (None: the default group) runs
    on the emulating backend; None otherwise (emulating_group)."""
    emulating = emulating_group(group)
    return None if emulating is None else emulating.now_s


def start_loop(group: Any = None) -> None:
    """Count this rank's compute at its device's speed from now on (the loop starts here), when `group` (None: the
    default group) runs on the emulating backend; nothing otherwise. No-op once the loop has started."""
    emulating = emulating_group(group)
    if emulating is not None:
        with emulating.state.lock:
            emulating.state.clock.start_loop()


def host_work(group: Any = None) -> AbstractContextManager[None]:
    """A block whose compute counts at this machine's speed, and whose operations do not start the loop (set-up),
    when `group` (None: the default group) runs on the emulating backend; a block that changes nothing otherwise."""
    emulating = emulating_group(group)
    return contextlib.nullcontext() if emulating is None else emulating.state.clock.host_work()
