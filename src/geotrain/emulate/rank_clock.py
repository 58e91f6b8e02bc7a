"""This rank's emulated clock as seen from a program that times itself (DiLoCo's adaptive local steps).

Under `geotrain emulate` every rank runs on this one machine, so wall seconds say how fast this machine is, not
the emulated device: with `--emulate-gpu-speed` a T4 rank computes as fast as an A100 rank in wall time. The
rank's emulated clock counts its compute at its device's speed (compute_scale x measured, clock.py) and its
collectives as the links emulate them; a program that measures seconds per step should read it instead.
"""

from __future__ import annotations

from collections.abc import Callable
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
