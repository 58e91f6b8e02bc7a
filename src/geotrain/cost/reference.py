"""Plain-loop reference of the "yuan" model, written straight from DESIGN.md's formulas.

Slow on purpose: tests check the vectorised models against it.
"""

from __future__ import annotations

from collections.abc import Sequence

from geotrain.cluster import Cluster
from geotrain.job import Job


def yuan_cost_reference(cluster: Cluster, job: Job, assignment: Sequence[Sequence[int]]) -> dict[str, float]:
    """{"dp", "pp", "total"} in seconds for `assignment[s][r]`."""
    stages, replicas = len(assignment), len(assignment[0])
    c_dp = job.dp_bytes(stages)
    c_pp = job.pp_bytes(replicas)
    lat = cluster.latency_ms.tolist()
    bw = cluster.bandwidth_gbps.tolist()
    dp = 0.0
    for s in range(stages):
        group = [int(d) for d in assignment[s]]
        for d in group:
            seconds = 0.0
            for other in group:
                if other != d:
                    seconds += 2 * (lat[d][other] / 1e3 + 8 * c_dp / (replicas * bw[d][other] * 1e9))
            dp = max(dp, seconds)
    pp = 0.0
    for r in range(replicas):
        seconds = 0.0
        for s in range(stages - 1):
            a, b = int(assignment[s][r]), int(assignment[s + 1][r])
            seconds += 2 * (lat[a][b] / 1e3 + 8 * c_pp / (bw[a][b] * 1e9))
        pp = max(pp, seconds)
    return {"dp": dp, "pp": pp, "total": dp + pp}
