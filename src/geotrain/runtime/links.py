"""The link emulation model: how long a transfer between two cluster devices takes, in seconds.

This is emulation, not traffic shaping. Every worker runs on this machine and the real transfer
(gloo over localhost) is fast; the transport layer then sleeps until the emulated time has passed:

- point-to-point (pipeline activations and their gradients), one directed link src -> dst:
  a message of b bytes handed over at time t starts when the link is free (messages on one link
  are serialised, FIFO), occupies it for 8 b / bandwidth, and arrives `latency` later:
      start = max(t, free_at);  free_at = start + 8 b / bw;  arrival = free_at + latency.
  Back-to-back messages therefore pay the latency once (it is pipelined), as on a real link.
- the data-parallel exchange of a stage's group D (n = |D| devices, b payload bytes per device):
  the cost model's scatter-gather all-reduce, every member finishes together after
      max_{d in D} sum_{d' in D, d' != d} 2 (latency(d, d') + 8 (b / n) / bw(d, d')).
All times are multiplied by `time_scale` (0 turns emulation off: only the real transfer counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from geotrain.cluster import Cluster
from geotrain.errors import GeotrainError


class LinkModelError(GeotrainError, ValueError):
    """Bad time scale or device index."""


@dataclass(frozen=True, eq=False)
class LinkModel:
    """One-way latency (s) and bandwidth (bit/s) between every device pair, and the time scale."""

    latency_s: np.ndarray
    bandwidth_bps: np.ndarray
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not np.isfinite(self.time_scale) or self.time_scale < 0:
            raise LinkModelError(f"time_scale must be a finite number >= 0, got {self.time_scale}")

    @classmethod
    def from_cluster(cls, cluster: Cluster, time_scale: float = 1.0) -> LinkModel:
        return cls(cluster.latency_s, cluster.bandwidth_bps, float(time_scale))

    @property
    def n_devices(self) -> int:
        return int(self.latency_s.shape[0])

    def serialisation_s(self, src: int, dst: int, nbytes: float) -> float:
        """Scaled seconds the link src -> dst is busy sending `nbytes` (0 for src == dst)."""
        if src == dst:
            return 0.0
        return 8.0 * nbytes / float(self.bandwidth_bps[src, dst]) * self.time_scale

    def latency(self, src: int, dst: int) -> float:
        """Scaled one-way latency in seconds (0 for src == dst)."""
        return 0.0 if src == dst else float(self.latency_s[src, dst]) * self.time_scale

    def transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        """Scaled seconds of one message on an idle link: latency + 8 bytes / bandwidth."""
        return self.latency(src, dst) + self.serialisation_s(src, dst, nbytes)

    def allreduce_s(self, devices: Sequence[int], nbytes: float) -> float:
        """Scaled seconds of the scatter-gather all-reduce of `nbytes` per device over `devices`."""
        group = np.asarray(devices, dtype=np.int64)
        n = len(group)
        if n < 2:
            return 0.0
        latency = self.latency_s[np.ix_(group, group)]
        bandwidth = self.bandwidth_bps[np.ix_(group, group)]
        off = ~np.eye(n, dtype=bool)
        pair = np.zeros((n, n))
        pair[off] = 2.0 * (latency[off] + 8.0 * (nbytes / n) / bandwidth[off])
        return float(pair.sum(axis=1).max()) * self.time_scale


class LinkQueue:
    """The sender's FIFO clock of one directed link: when each handed-over message arrives."""

    def __init__(self, links: LinkModel, src: int, dst: int) -> None:
        self.links = links
        self.src = src
        self.dst = dst
        self.free_at = float("-inf")

    def arrival(self, nbytes: float, handoff_t: float) -> float:
        """Emulated arrival time (same clock as `handoff_t`) of `nbytes` handed over at `handoff_t`."""
        start = max(handoff_t, self.free_at)
        self.free_at = start + self.links.serialisation_s(self.src, self.dst, nbytes)
        return self.free_at + self.links.latency(self.src, self.dst)


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals: how long a link had a message in flight."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total
