"""What a cluster costs: a price per GPU-hour by GPU type and per GB leaving each region (USD).

In a cluster file (either form), optional:

    prices:
      gpu_hour: {H100: 2.5, A100: 1.6, T4: 0.35}    # USD per GPU-hour, every GPU type of the cluster
      egress_per_gb: {default: 0.08, saopaulo: 0.15} # USD per GB that leaves a region (or one number for all)

Traffic inside a region is free. cost/money.py turns a plan's step into dollars with them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from geotrain.cluster.errors import ClusterError
from geotrain.errors import shown

MAX_USD = 1e6
"""A price above this (per GPU-hour or per GB) is taken for a typing slip."""


@dataclass(frozen=True)
class Prices:
    """`gpu_hour_usd`: USD per GPU-hour by GPU type; `egress_usd_per_gb`: USD per GB leaving each region (region
    order of the cluster)."""

    gpu_hour_usd: Mapping[str, float]
    egress_usd_per_gb: tuple[float, ...]

    def __post_init__(self) -> None:
        for where, value in [*((f"gpu_hour.{k}", v) for k, v in self.gpu_hour_usd.items()),
                             *((f"egress_per_gb[{g}]", v) for g, v in enumerate(self.egress_usd_per_gb))]:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_USD \
                    or not math.isfinite(value):
                raise ClusterError(f"prices.{where}: must be a number of USD in 0..{MAX_USD:g}, got {shown(value)}")

    def check(self, gpus: Sequence[str], n_regions: int, cluster: str) -> None:
        """ClusterError unless every GPU type has a price and every region an egress price."""
        missing = sorted(set(gpus) - set(self.gpu_hour_usd))
        if missing:
            raise ClusterError(f"cluster {shown(cluster)}: prices.gpu_hour has no price for {', '.join(missing)}")
        if len(self.egress_usd_per_gb) != n_regions:
            raise ClusterError(f"cluster {shown(cluster)}: prices need one egress price per region ({n_regions}), "
                               f"got {len(self.egress_usd_per_gb)}")

    def of_regions(self, regions: Sequence[int]) -> Prices:
        """The same prices for a cluster of these regions (indices into this one's), in that order."""
        return Prices(dict(self.gpu_hour_usd), tuple(self.egress_usd_per_gb[g] for g in regions))

    def to_dict(self, region_names: Sequence[str]) -> dict[str, Any]:
        """The file's `prices` mapping (egress per region by name)."""
        return {"gpu_hour": dict(self.gpu_hour_usd),
                "egress_per_gb": {name: price for name, price in zip(region_names, self.egress_usd_per_gb)}}
