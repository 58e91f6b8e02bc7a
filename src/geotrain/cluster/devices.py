"""The one check of a device list against a cluster (emulate, netlab, their CLIs and launchers).

A device list maps rank i to cluster device devices[i]: every entry an integer index in
0..n_devices-1, none repeated, at least one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from geotrain.errors import GeotrainError


class DeviceListError(GeotrainError, ValueError):
    """A device list that does not fit the cluster (or is not a list of integers)."""


def check_device_list(devices: Sequence[object], n_devices: int, source: str = "--devices") -> list[int]:
    """`devices` as plain ints, each in 0..n_devices-1 and listed once; DeviceListError names the
    source and the offending entry otherwise."""
    if len(devices) == 0:
        raise DeviceListError(f"{source}: needs at least one device")
    seen: set[int] = set()
    for i, device in enumerate(devices):
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or not 0 <= device < n_devices:
            raise DeviceListError(f"{source}[{i}]: device index must be in 0..{n_devices - 1}, got {device!r:.40}")
        if int(device) in seen:
            raise DeviceListError(f"{source}[{i}]: device {device} listed twice")
        seen.add(int(device))
    return [int(d) for d in devices]
