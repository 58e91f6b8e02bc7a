"""What one training iteration puts on the network, as every cost model sees it: `Traffic`.

Planning derives it from a Job (`traffic_of_job`: gradient bytes = params x bytes_per_value split
evenly over the stages, activation bytes = seq x hidden x bytes_per_value x per-replica batch);
prediction derives it from the bytes a running job measured (runtime/predict.py). The cost models
(cost/yuan.py, ring.py, dtfm.py, compute.py, schedule.py) take only this and the cluster.

- `dp_bytes[s]`: gradient bytes stage s all-reduces over its R replicas (what each member holds).
- `pp_bytes[c]`: activation bytes one replica sends across cut c per iteration (all micro-batches);
  the gradient going back is the same size. Cuts are those of the pipeline the schedule runs:
  S x V - 1 for V virtual stages per device (looped schedules); cut c runs from the device of
  stage c mod S to the device of stage (c + 1) mod S. A cut of 0 bytes sends no message.
- `wire`: bytes per value on the wire per traffic kind and link class (how codecs enter), relative
  to `bytes_per_value`, and `dp_latency_rounds`, the latency-bound collectives of one DP exchange.
- `sync_period` H: the DP exchange runs every H steps (local SGD); per iteration it costs 1/H.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from geotrain.cluster import Cluster
from geotrain.errors import GeotrainError, shown

if TYPE_CHECKING:
    from geotrain.job import Job


class TrafficError(GeotrainError, ValueError):
    """A byte count, bytes-per-value, latency factor or sync period out of range."""


def _positive(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@dataclass(frozen=True)
class WireBytes:
    """Bytes per value on the wire (None: the native bytes_per_value), per traffic kind and link
    class (intra: both devices in one region; inter: otherwise), and the latency rounds of one DP
    exchange (2 for PowerSGD's P and Q, 1/2 for an all-gather). `WireBytes()` changes nothing."""

    dp_intra: float | None = None
    dp_inter: float | None = None
    pp_intra: float | None = None
    pp_inter: float | None = None
    dp_latency_rounds: float = 1.0

    def __post_init__(self) -> None:
        for key in ("dp_intra", "dp_inter", "pp_intra", "pp_inter", "dp_latency_rounds"):
            value = getattr(self, key)
            if value is None and key != "dp_latency_rounds":
                continue
            if not _positive(value):
                raise TrafficError(f"wire bytes: {key} must be a finite number > 0, got {shown(value)}")

    @classmethod
    def uniform(cls, dp: float | None = None, pp: float | None = None, dp_latency_rounds: float = 1.0) -> WireBytes:
        """The same bytes per value on both link classes (a flat codec)."""
        return cls(dp_intra=dp, dp_inter=dp, pp_intra=pp, pp_inter=pp, dp_latency_rounds=dp_latency_rounds)

    def byte_scale(self, cluster: Cluster, kind: str, native: float) -> np.ndarray | None:
        """N x N multiplier of the native bytes for `kind` ("dp" or "pp"); None when both classes are unset."""
        intra, inter = (self.dp_intra, self.dp_inter) if kind == "dp" else (self.pp_intra, self.pp_inter)
        if intra is None and inter is None:
            return None
        intra_scale = (intra if intra is not None else native) / native
        inter_scale = (inter if inter is not None else native) / native
        same_region = cluster.region_of[:, None] == cluster.region_of[None, :]
        return np.where(same_region, intra_scale, inter_scale)


@dataclass(frozen=True)
class Traffic:
    """Bytes per iteration by stage and cut for R replicas (see the module docstring)."""

    dp_bytes: tuple[float, ...]
    pp_bytes: tuple[float, ...]
    replicas: int
    bytes_per_value: float = 1.0
    wire: WireBytes = field(default_factory=WireBytes)
    sync_period: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "dp_bytes", _byte_counts(self.dp_bytes, "dp_bytes"))
        object.__setattr__(self, "pp_bytes", _byte_counts(self.pp_bytes, "pp_bytes"))
        if not self.dp_bytes:
            raise TrafficError("traffic: dp_bytes needs one entry per stage, got none")
        for key in ("replicas", "sync_period"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TrafficError(f"traffic: {key} must be an integer >= 1, got {shown(value)}")
        if not _positive(self.bytes_per_value):
            raise TrafficError(f"traffic: bytes_per_value must be a finite number > 0, got {shown(self.bytes_per_value)}")
        cuts = len(self.pp_bytes) + 1
        if cuts % self.stages:
            raise TrafficError(f"traffic: pp_bytes needs S x V - 1 cuts for S = {self.stages} stages, "
                               f"got {len(self.pp_bytes)}")
        if not isinstance(self.wire, WireBytes):
            raise TrafficError(f"traffic: wire must be a WireBytes, got {shown(self.wire)}")

    @property
    def stages(self) -> int:
        """S: devices in one replica's pipeline (one DP group each)."""
        return len(self.dp_bytes)

    @property
    def virtual_stages(self) -> int:
        """V: pipeline stages per device (1, or more for the looped schedules)."""
        return (len(self.pp_bytes) + 1) // self.stages

    @property
    def dp_latency_rounds(self) -> float:
        return self.wire.dp_latency_rounds

    def cut_devices(self) -> tuple[np.ndarray, np.ndarray]:
        """(sending stage, receiving stage) of every cut, (C,) each: stage c mod S -> (c + 1) mod S."""
        cuts = np.arange(len(self.pp_bytes))
        return cuts % self.stages, (cuts + 1) % self.stages

    def uniform_dp(self) -> bool:
        return len(set(self.dp_bytes)) == 1

    def uniform_pp(self) -> bool:
        """One pipeline of S - 1 cuts of equal bytes (the pairwise form of cost/base.py holds)."""
        return self.virtual_stages == 1 and len(set(self.pp_bytes)) <= 1


def _byte_counts(values: object, key: str) -> tuple[float, ...]:
    try:
        counts = tuple(float(v) for v in np.asarray(values, dtype=float).reshape(-1))
    except (TypeError, ValueError):
        raise TrafficError(f"traffic: {key} must be a sequence of byte counts, got {shown(values)}") from None
    for value in counts:
        if not math.isfinite(value) or value < 0:
            raise TrafficError(f"traffic: {key} must be finite byte counts >= 0, got {shown(value)}")
    return counts


def traffic_of_job(job: Job, stages: int, replicas: int, wire: WireBytes | None = None,
                   sync_period: int = 1, n_devices: int | None = None) -> Traffic:
    """The job's traffic for S = `stages` stages (one device each) and R = `replicas`: every stage
    all-reduces job.dp_bytes(S), every cut carries job.pp_bytes(R). Raises JobError for a layout that
    needs more than `n_devices` (None: any) and for R > global batch, in that order."""
    from geotrain.job import check_layout

    check_layout(stages, replicas, stages * replicas if n_devices is None else n_devices)
    return Traffic(dp_bytes=(job.dp_bytes(stages),) * stages, pp_bytes=(job.pp_bytes(replicas),) * (stages - 1),
                   replicas=replicas, bytes_per_value=float(job.bytes_per_value), wire=wire or WireBytes(),
                   sync_period=sync_period)
