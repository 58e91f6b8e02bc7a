"""Wire bytes per value by link class: the cost models' hook for compression.

A link is *intra* when both devices sit in one region, *inter* otherwise. `LinkBytes` gives, for the
data-parallel exchange and for the pipeline activations separately, the bytes each value takes on the
wire on each link class (e.g. fp32 inside regions and 1/8 byte (sign) between them). Unset (None)
means the job's own `bytes_per_value`, so `LinkBytes()` reproduces the uncompressed model exactly.
`dp_latency_factor` counts the latency-bound collectives of one exchange (2 for PowerSGD's P and Q).
The cost model turns this into an N x N multiplier on c_dp and c_pp (`byte_scale`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from geotrain.cluster import Cluster
from geotrain.errors import GeotrainError, shown


class LinkBytesError(GeotrainError, ValueError):
    """A bytes-per-value or latency factor that is not a finite number > 0."""


@dataclass(frozen=True)
class LinkBytes:
    """Bytes per value on the wire (None: the job's bytes_per_value), per traffic kind and link class."""

    dp_intra: float | None = None
    dp_inter: float | None = None
    pp_intra: float | None = None
    pp_inter: float | None = None
    dp_latency_factor: float = 1.0

    def __post_init__(self) -> None:
        for key in ("dp_intra", "dp_inter", "pp_intra", "pp_inter", "dp_latency_factor"):
            value = getattr(self, key)
            if value is None and key != "dp_latency_factor":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise LinkBytesError(f"link bytes: {key} must be a finite number > 0, got {shown(value)}")

    @classmethod
    def uniform(cls, dp: float | None = None, pp: float | None = None, dp_latency_factor: float = 1.0) -> LinkBytes:
        """The same bytes per value on both link classes (a flat codec)."""
        return cls(dp_intra=dp, dp_inter=dp, pp_intra=pp, pp_inter=pp, dp_latency_factor=dp_latency_factor)

    def byte_scale(self, cluster: Cluster, kind: str, job_bytes_per_value: float) -> np.ndarray | None:
        """N x N multiplier of the job's bytes for `kind` ("dp" or "pp"); None when both classes are unset."""
        intra, inter = (self.dp_intra, self.dp_inter) if kind == "dp" else (self.pp_intra, self.pp_inter)
        if intra is None and inter is None:
            return None
        intra_scale = (intra if intra is not None else job_bytes_per_value) / job_bytes_per_value
        inter_scale = (inter if inter is not None else job_bytes_per_value) / job_bytes_per_value
        same_region = cluster.region_of[:, None] == cluster.region_of[None, :]
        return np.where(same_region, intra_scale, inter_scale)
