"""The emulated network: one-way latency and bandwidth between devices, each device's NIC, the time scale.

Units: seconds and bit/s inside (files and options give ms and Gbit/s). A device's NIC is its uplink:
everything the device sends at once shares `nic_bps[d]` (infinite = only the links limit it).
`time_scale` F: one emulated second lasts F wall seconds (F = 0: no sleeping, emulated times only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from geotrain.cluster import Cluster
from geotrain.errors import GeotrainError


class EmulationError(GeotrainError, ValueError):
    """Bad emulation input: device list, time scale, NIC figure, report path."""


class LinkDown(GeotrainError, ConnectionError):
    """An operation over links that are cut (a partition): nothing is delivered to or from a cut device."""


@dataclass(frozen=True, eq=False)
class EmulatedNetwork:
    """Latency (s) and bandwidth (bit/s) between every device pair, NIC uplink (bit/s) per device."""

    latency_s: np.ndarray
    bandwidth_bps: np.ndarray
    nic_bps: np.ndarray
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not np.isfinite(self.time_scale) or self.time_scale < 0:
            raise EmulationError(f"--time-scale: must be a finite number >= 0, got {self.time_scale!r}")
        n = self.latency_s.shape[0]
        if self.nic_bps.shape != (n,) or np.any(self.nic_bps <= 0) or np.any(np.isnan(self.nic_bps)):
            raise EmulationError(f"nic_gbps: need one positive figure per device ({n}), got {self.nic_bps!r:.60}")

    @classmethod
    def from_cluster(cls, cluster: Cluster, time_scale: float = 1.0,
                     nic_gbps: float | Sequence[float] | None = None) -> EmulatedNetwork:
        """The cluster's links and NICs; `nic_gbps` (one figure for all devices or one per device)
        replaces the cluster's own `nic_gbps` (per device, inf: unlimited) when given."""
        n = cluster.n_devices
        chosen = cluster.nic_gbps if nic_gbps is None else nic_gbps
        nic = np.broadcast_to(np.asarray(chosen, dtype=np.float64), (n,)) * 1e9
        return cls(cluster.latency_s, cluster.bandwidth_bps, np.array(nic, dtype=np.float64), float(time_scale))

    @property
    def n_devices(self) -> int:
        return int(self.latency_s.shape[0])

    def latency(self, src: int, dst: int) -> float:
        """One-way latency src -> dst in emulated seconds (0 for src == dst)."""
        return 0.0 if src == dst else float(self.latency_s[src, dst])

    def rate_bps(self, src: int, dst: int) -> float:
        """The rate one message alone gets: min(link bandwidth, sender's NIC); inf for src == dst."""
        if src == dst:
            return float("inf")
        return min(float(self.bandwidth_bps[src, dst]), float(self.nic_bps[src]))
