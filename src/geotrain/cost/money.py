"""What a plan's step costs in US dollars, from a cluster's prices (cluster/prices.py).

    usd_per_step = sum over the devices used of gpu_hour_usd[gpu] x step_s / 3600
                 + sum over regions g of egress_bytes_g / 1e9 x egress_usd_per_gb[g]

Egress bytes per step (bytes that leave a region; traffic inside one is free), as the "yuan" model moves them:
- each stage's DP group D (n members): every member sends `dp_pair_bytes` to every other member per step
  (`exchange_pair_bytes`: an all-reduce of c bytes, scatter-gather, sends 2 c / n to each peer; an all-gathered
  codec's payload p goes whole to each peer; a recipe's outer sync every H steps: / H);
- each pipeline cut of each replica: `pp_bytes` forward from stage s's device and `pp_bytes` back from s + 1's;
- asynchronous outer updates (`star_bytes`): every replica sends its model to the server (replica 0's first
  stage) and gets one back, every H steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from geotrain.cluster import Cluster

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class StepMoney:
    """USD per step: the GPU-hours of the devices used and the egress, with the GB that leave each region."""

    gpu_usd: float
    egress_usd: float
    egress_gb: tuple[float, ...]  # per region, per step
    step_s: float

    @property
    def usd(self) -> float:
        return self.gpu_usd + self.egress_usd

    @property
    def usd_per_hour(self) -> float:
        return self.usd * SECONDS_PER_HOUR / self.step_s if self.step_s > 0 else 0.0

    def to_json(self, region_names: list[str] | tuple[str, ...], steps: int | None = None) -> dict[str, Any]:
        """The plan's "money" object; `steps`: the run's, to price the run too."""
        doc = {"usd_per_step": self.usd, "gpu_usd_per_step": self.gpu_usd, "egress_usd_per_step": self.egress_usd,
               "egress_gb_per_step": dict(zip(region_names, self.egress_gb)), "usd_per_hour": self.usd_per_hour}
        return doc if steps is None else {**doc, "steps": steps, "usd_per_run": self.usd * steps}


def exchange_pair_bytes(total_bytes: float, members: int, gathered: bool, period: int = 1) -> float:
    """Bytes one DP member sends each other member per step for an exchange of `total_bytes` (its payload)
    every `period` steps: scatter-gather 2 c / n, or the whole payload to each peer when `gathered`."""
    if members < 2:
        return 0.0
    per_exchange = total_bytes if gathered else 2.0 * total_bytes / members
    return per_exchange / period


def egress_bytes(cluster: Cluster, assignment: Any, dp_pair_bytes: float, pp_bytes: float = 0.0) -> np.ndarray:
    """(G,) bytes leaving each region per step (see the module doc)."""
    assignment = np.asarray(assignment, dtype=np.int64)
    region = cluster.region_of
    out = np.zeros(cluster.n_regions)
    for row in assignment:  # a stage's DP group: each member to every member of another region
        regions = region[row]
        for g in np.unique(regions):
            inside = int(np.sum(regions == g))
            out[g] += inside * (len(row) - inside) * dp_pair_bytes
    for s in range(assignment.shape[0] - 1):  # cuts: forward from s, backward from s + 1
        for r in range(assignment.shape[1]):
            a, b = region[assignment[s, r]], region[assignment[s + 1, r]]
            if a != b:
                out[a] += pp_bytes
                out[b] += pp_bytes
    return out


def star_bytes(cluster: Cluster, assignment: Any, model_bytes: float, period: int) -> np.ndarray:
    """(G,) bytes leaving each region per step with asynchronous outer updates: every replica's model to the
    server (replica 0's first-stage device) and back, every `period` steps."""
    assignment = np.asarray(assignment, dtype=np.int64)
    region = cluster.region_of
    server = region[assignment[0, 0]]
    out = np.zeros(cluster.n_regions)
    for r in range(1, assignment.shape[1]):
        g = region[assignment[0, r]]
        if g != server:
            out[g] += model_bytes / period
            out[server] += model_bytes / period
    return out


def step_money(cluster: Cluster, assignment: Any, step_s: float, egress: np.ndarray) -> StepMoney:
    """USD of one step of `step_s` seconds on the devices of `assignment` with `egress` bytes per region.
    ValueError when the cluster has no prices."""
    if cluster.prices is None:
        raise ValueError(f"cluster {cluster.name!r} has no prices")
    used = np.unique(np.asarray(assignment, dtype=np.int64).ravel())
    per_hour = sum(cluster.prices.gpu_hour_usd[cluster.gpus[d]] for d in used)
    egress_gb = np.asarray(egress, dtype=float) / 1e9
    return StepMoney(gpu_usd=per_hour * step_s / SECONDS_PER_HOUR,
                     egress_usd=float(egress_gb @ np.asarray(cluster.prices.egress_usd_per_gb)),
                     egress_gb=tuple(float(x) for x in egress_gb), step_s=step_s)
