"""Plain-loop reference of the "yuan" model, written straight from DESIGN.md's formulas.

Slow on purpose: tests check the vectorised models against it.
"""

from __future__ import annotations

from collections.abc import Sequence

from geotrain.cluster import Cluster
from geotrain.cost.link_bytes import LinkBytes
from geotrain.job import Job


def yuan_cost_reference(cluster: Cluster, job: Job, assignment: Sequence[Sequence[int]],
                        link_bytes: LinkBytes | None = None) -> dict[str, float]:
    """{"dp", "pp", "total"} in seconds for `assignment[s][r]`; `link_bytes` as in YuanCostModel."""
    lb = link_bytes or LinkBytes()
    stages, replicas = len(assignment), len(assignment[0])
    c_dp = job.dp_bytes(stages)
    c_pp = job.pp_bytes(replicas)
    lat = cluster.latency_ms.tolist()
    bw = cluster.bandwidth_gbps.tolist()
    region = cluster.region_of.tolist()

    def scale(intra: float | None, inter: float | None, a: int, b: int) -> float:
        value = intra if region[a] == region[b] else inter
        return 1.0 if value is None else value / job.bytes_per_value

    dp = 0.0
    for s in range(stages):
        group = [int(d) for d in assignment[s]]
        for d in group:
            seconds = 0.0
            for other in group:
                if other != d:
                    c = c_dp * scale(lb.dp_intra, lb.dp_inter, d, other)
                    seconds += 2 * (lb.dp_latency_factor * lat[d][other] / 1e3 + 8 * c / (replicas * bw[d][other] * 1e9))
            dp = max(dp, seconds)
    pp = 0.0
    for r in range(replicas):
        seconds = 0.0
        for s in range(stages - 1):
            a, b = int(assignment[s][r]), int(assignment[s + 1][r])
            c = c_pp * scale(lb.pp_intra, lb.pp_inter, a, b)
            seconds += 2 * (lat[a][b] / 1e3 + 8 * c / (bw[a][b] * 1e9))
        pp = max(pp, seconds)
    return {"dp": dp, "pp": pp, "total": dp + pp}
