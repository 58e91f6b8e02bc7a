"""Plain-loop reference of the "yuan" model, written straight from its formulas (cost/yuan.py).

Also the sharded "yuan+compute" (cost/shards.py: K devices per slot) from per-device loops.
Slow on purpose: tests check the vectorised models against it.
"""

from __future__ import annotations

from collections.abc import Sequence

from geotrain.cluster import Cluster
from geotrain.cost.gpus import gpu_peak_flops
from geotrain.cost.traffic import Traffic
from geotrain.job import Job


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


def sharded_compute_reference(cluster: Cluster, job: Job, devices: Sequence[Sequence[Sequence[int]]],
                              micro_batches: int, utilisation: float) -> dict[str, float]:
    """{"dp", "pp", "compute", "total"} of "yuan+compute" for a sharded layout `devices[s][r][k]` (cost/shards.py),
    written from the per-device figures: a slot pair costs its same-shard pairs' slowest latency and K x their
    least bandwidth; a slot computes 1/K of its share at its slowest GPU, plus three rings (two all-gathers, one
    reduce-scatter) of the largest stage's 16-bit parameters over its site's slowest intra-slot link."""
    stages, replicas, k = len(devices), len(devices[0]), len(devices[0][0])
    lat, bw = cluster.latency_s.tolist(), cluster.bandwidth_bps.tolist()

    def pair(a: Sequence[int], b: Sequence[int]) -> tuple[float, float]:
        return max(lat[x][y] for x, y in zip(a, b)), k * min(bw[x][y] for x, y in zip(a, b))

    intra: dict[str, tuple[float, float]] = {}
    for row in devices:
        for slot in row:
            for i in slot:
                for j in slot:
                    if i < j:
                        site = cluster.site_of(i)
                        old = intra.get(site, (0.0, float("inf")))
                        intra[site] = (max(old[0], lat[i][j]), min(old[1], bw[i][j]))
    embedding = job.vocab * job.hidden
    per_layer = max(job.params - embedding, 0.0) / job.layers
    largest = per_layer * job.layers / stages + embedding  # stage 0 (and S-1) holds the embedding
    stage_bytes = largest * job.bytes_per_value
    dp = 0.0
    for s in range(stages):
        for r in range(replicas):
            seconds = 0.0
            for other in range(replicas):
                if other != r:
                    a, b = pair(devices[s][r], devices[s][other])
                    seconds += 2 * (a + 8 * job.dp_bytes(stages) / (replicas * b))
            dp = max(dp, seconds)
    worst = 0.0
    pp = 0.0
    for r in range(replicas):
        pipe = 0.0
        for s in range(stages - 1):
            a, b = pair(devices[s][r], devices[s + 1][r])
            pipe += 2 * (a + 8 * job.pp_bytes(replicas) / b)
        times = []
        for s in range(stages):
            slot = devices[s][r]
            peak = min(gpu_peak_flops(cluster.gpus[d]) for d in slot)
            seconds = job.flops_per_iteration() / (stages * replicas * k) / (peak * utilisation)
            if k > 1:
                a, b = intra[cluster.site_of(slot[0])]
                seconds += 3 * (k - 1) * (a + 8 * stage_bytes / k / b)
            times.append(seconds)
        compute = sum(times) / micro_batches + max(times) * (micro_batches - 1) / micro_batches
        pp = max(pp, pipe)
        worst = max(worst, pipe + compute)
        compute_max = compute if r == 0 else max(compute_max, compute)
    return {"dp": dp, "pp": pp, "compute": compute_max, "total": dp + worst}
