"""Plain-loop reference of the "yuan" model, written straight from its formulas (cost/yuan.py).

Slow on purpose: tests check the vectorised models against it.
"""

from __future__ import annotations

from collections.abc import Sequence

from geotrain.cluster import Cluster
from geotrain.cost.traffic import Traffic


def yuan_cost_reference(cluster: Cluster, traffic: Traffic, assignment: Sequence[Sequence[int]]) -> dict[str, float]:
    """{"dp", "pp", "total"} in seconds for `assignment[s][r]` under `traffic` (as YuanCostModel)."""
    wire = traffic.wire
    stages, replicas = len(assignment), len(assignment[0])
    lat = cluster.latency_ms.tolist()
    bw = cluster.bandwidth_gbps.tolist()
    region = cluster.region_of.tolist()

    def scale(intra: float | None, inter: float | None, a: int, b: int) -> float:
        value = intra if region[a] == region[b] else inter
        return 1.0 if value is None else value / traffic.bytes_per_value

    dp = 0.0
    for s in range(stages):
        group = [int(d) for d in assignment[s]]
        for d in group:
            seconds = 0.0
            for other in group:
                if other != d and traffic.dp_bytes[s] > 0:
                    c = traffic.dp_bytes[s] * scale(wire.dp_intra, wire.dp_inter, d, other)
                    seconds += 2 * (wire.dp_latency_rounds * lat[d][other] / 1e3
                                    + 8 * c / (replicas * bw[d][other] * 1e9))
            dp = max(dp, seconds / traffic.sync_period)
    pp = 0.0
    for r in range(replicas):
        seconds = 0.0
        for cut, cut_bytes in enumerate(traffic.pp_bytes):
            a, b = int(assignment[cut % stages][r]), int(assignment[(cut + 1) % stages][r])
            if a != b and cut_bytes > 0:
                c = cut_bytes * scale(wire.pp_intra, wire.pp_inter, a, b)
                seconds += 2 * (lat[a][b] / 1e3 + 8 * c / (bw[a][b] * 1e9))
        pp = max(pp, seconds)
    return {"dp": dp, "pp": pp, "total": dp + pp}
