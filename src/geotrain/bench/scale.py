"""Placement at scale: seeded multi-cloud clusters of growing size, every method under a time limit,
and a proven lower bound on each cluster's optimum.

For each size n (devices), the cluster is `multicloud(regions, n // regions, seed, jitter)` (family
"multicloud"; "uniform" and "jittered" fix the jitter at 0 and 0.1), `uneven_regions(n, seed)`
(family "uneven": 4-8 regions of unequal sizes and intra-region speeds, region-uniform) or
`uneven_six_regions(n, seed)` (family "many-region": issue 21's six regions of 16/12/12/8/8/8 x n/64),
and the layout uses every device: S = `stages`, R = n // S. Each method runs once with the same seed
and time limit; the lower bound (`search.bounds.lower_bound`, guarded: back within its limit) is
computed once per cluster, given the best total any method found (and raised to a method's own
proven bound, exact's), and every row's gap is (total - bound) / total; wall_s against limit_s
shows whether the time limits held.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from geotrain.cluster import Cluster, region_cluster
from geotrain.cluster.generators import make_network
from geotrain.cluster.scale import multicloud
from geotrain.cost import build_cost_model
from geotrain.job import load_job
from geotrain.search import PlacementProblem, ProgressCallback, SearchError, get_method, run_search
from geotrain.search.bound_beside import BoundBeside
from geotrain.search.bounds import gap, lower_bound

DEFAULT_METHODS = ("pipeline-local", "dp-local", "local-search", "genetic", "hierarchical", "exact", "region-paths")
BOUND_MODES = ("after", "beside")
FAMILIES = ("multicloud", "uniform", "jittered", "uneven", "many-region")
"""multicloud: `multicloud` with the config's jitter; uniform / jittered: the same with jitter 0 / 0.1;
uneven: `uneven_regions`; many-region: `uneven_six_regions` (sizes multiples of 64)."""


def uneven_regions(devices: int, seed: int) -> Cluster:
    """A seeded region-structured cluster of `devices` devices: 4-8 regions (at least 2 devices
    each) of unequal sizes (a Dirichlet(1) split), intra-region links 5..50 Gbit/s and 0.1..0.5 ms per
    region, region pairs 0.3..1.3 Gbit/s and 10..250 ms (the seed's ranges), all V100."""
    rng = np.random.default_rng([seed, devices])
    regions = int(rng.integers(4, 9))
    if devices < 2 * regions:
        raise SearchError(f"bench scale: uneven clusters need >= {2 * regions} devices, got {devices}")
    spare = devices - 2 * regions
    sizes = 2 + np.floor(rng.dirichlet(np.ones(regions)) * spare).astype(np.int64)
    sizes[np.argmax(sizes)] += devices - int(sizes.sum())
    bandwidth = np.diag(rng.uniform(5.0, 50.0, regions))
    latency = np.diag(rng.uniform(0.1, 0.5, regions))
    for a in range(regions):
        for b in range(a + 1, regions):
            bandwidth[a, b] = bandwidth[b, a] = rng.uniform(0.3, 1.3)
            latency[a, b] = latency[b, a] = rng.uniform(10.0, 250.0)
    return region_cluster(f"uneven-{devices}-seed{seed}", [f"region{g}" for g in range(regions)], sizes,
                          np.round(bandwidth, 4), np.round(latency, 3), "V100")


UNEVEN_SIX_SIZES = (16, 12, 12, 8, 8, 8)
"""Region sizes of issue 21's 64-device case; `uneven_six_regions` scales them by devices / 64."""


def uneven_six_regions(devices: int = 64, seed: int = 0) -> Cluster:
    """Six regions of unequal size (16/12/12/8/8/8 x devices / 64; devices a multiple of 64), fast
    links inside (10 Gbit/s, 0.1 ms), uneven links between (`make_network`: each region pair
    0.3..1.3 Gbit/s and 10..250 ms from default_rng(seed)); region-uniform, all V100."""
    if devices < 64 or devices % 64:
        raise SearchError(f"bench scale: six-region clusters need a multiple of 64 devices, got {devices}")
    sizes = [size * devices // 64 for size in UNEVEN_SIX_SIZES]
    return make_network(sizes, 10.0, (0.3, 1.3), (10.0, 250.0), seed=seed,
                        name=f"uneven6-{devices}-seed{seed}")


@dataclass(frozen=True)
class ScaleBenchConfig:
    """sizes: device counts (multiples of regions x stages); jitter: per-pair bandwidth noise (0:
    region-uniform, so `exact` may apply); time_limit_s: per method; bound_time_limit_s: per cluster."""

    sizes: tuple[int, ...] = (64, 128, 256, 512, 1024)
    regions: int = 8
    stages: int = 8
    jitter: float = 0.1
    seed: int = 0
    job: str = "gpt-1.3b-seed"
    methods: tuple[str, ...] = DEFAULT_METHODS
    time_limit_s: float = 30.0
    bound_time_limit_s: float = 60.0
    family: str = "multicloud"
    bound: str = "after"
    """after: the methods, then one bound for bound_time_limit_s; beside: one method that reports its
    plans while it searches (auto), with the bound beside it from its first plan, both within
    time_limit_s (what `plan --lower-bound --time-limit` does on two or more cores)."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise SearchError(f"bench scale: family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        if self.bound not in BOUND_MODES:
            raise SearchError(f"bench scale: bound must be one of {', '.join(BOUND_MODES)}, got {self.bound!r}")
        if self.bound == "beside" and (len(self.methods) != 1 or not get_method(self.methods[0]).reports_plans):
            raise SearchError(f"bench scale: --bound beside runs one method that reports its plans while it "
                              f"searches (auto), got {', '.join(self.methods)}")
        for n in self.sizes:
            if self.family == "many-region":
                if n % 64 or n % self.stages:
                    raise SearchError(f"bench scale: many-region size {n} must be a multiple of 64 and of stages "
                                      f"({self.stages})")
                continue
            if self.family == "uneven":
                if n % self.stages or n < 16:
                    raise SearchError(f"bench scale: size {n} must be >= 16 and a multiple of stages ({self.stages})")
                continue
            if n % self.regions or n % self.stages or n < self.regions:
                raise SearchError(f"bench scale: size {n} must be a multiple of regions ({self.regions}) "
                                  f"and stages ({self.stages})")


@dataclass(frozen=True)
class ScaleRow:
    devices: int
    cluster: str
    stages: int
    replicas: int
    method: str
    seconds: float | None
    total_s: float | None
    lower_bound_s: float
    gap: float | None
    bound_source: str
    bound_seconds: float
    note: str = ""
    limit_s: float = 0.0
    wall_s: float = 0.0
    """limit_s: the method's time limit + the bound's (with the bound beside: the method's); wall_s: the
    method's seconds + the bound's (beside: the row's wall time); never above limit_s x 1.1 when the
    limits hold."""


def run_scale_bench(config: ScaleBenchConfig, progress: ProgressCallback | None = None) -> list[ScaleRow]:
    """Rows of (size, method) in order; a method that does not apply gets a row with a note."""
    job = load_job(config.job)
    rows: list[ScaleRow] = []
    steps, done = len(config.sizes) * (len(config.methods) + 1), 0
    for n in config.sizes:
        cluster = bench_cluster(config, n)
        S, R = config.stages, n // config.stages
        problem = PlacementProblem(cluster, build_cost_model("yuan", cluster, job, S, R))
        if config.bound == "beside":
            rows.append(_row_beside(config, problem, n, cluster.name))
            done += 2
            if progress is not None:
                progress(done, steps)
            continue
        results: list[tuple[str, Any, str]] = []
        for method in config.methods:
            try:
                result = run_search(method, problem, seed=config.seed, time_limit_s=config.time_limit_s)
                results.append((method, result, ""))
            except SearchError as exc:
                results.append((method, None, str(exc).split(" (")[0].split(": ")[-1][:48]))
            done += 1
            if progress is not None:
                progress(done, steps)
        found = [r.cost.total for _, r, _ in results if r is not None]
        bound = lower_bound(problem, upper_bound_s=min(found) if found else None, time_limit_s=config.bound_time_limit_s,
                            guard=True)
        own = [r.lower_bound for _, r, _ in results if r is not None and r.lower_bound is not None]
        if own and max(own) > bound.value_s:  # exact's certificate (or its MILP bound) is a bound too
            bound = replace(bound, value_s=float(max(own)), source="exact")
        done += 1
        if progress is not None:
            progress(done, steps)
        for method, result, note in results:
            total = None if result is None else float(result.cost.total)
            rows.append(ScaleRow(devices=n, cluster=cluster.name, stages=S, replicas=R, method=method,
                                 seconds=None if result is None else float(result.seconds), total_s=total,
                                 lower_bound_s=float(bound.value_s), gap=None if total is None else bound.gap(total),
                                 bound_source=bound.source, bound_seconds=float(bound.seconds), note=note,
                                 limit_s=config.time_limit_s + config.bound_time_limit_s,
                                 wall_s=(0.0 if result is None else float(result.seconds)) + float(bound.seconds)))
    return rows


def _row_beside(config: ScaleBenchConfig, problem: PlacementProblem, devices: int, name: str) -> ScaleRow:
    """The row of config.methods[0] with its bound beside it (search.bound_beside), both in time_limit_s."""
    start = time.perf_counter()
    beside = BoundBeside(problem, start + config.time_limit_s)
    result = run_search(config.methods[0], problem, seed=config.seed, time_limit_s=config.time_limit_s,
                        on_plan=beside.offer)
    result = beside.finish(result)
    total, bound = float(result.cost.total), float(result.lower_bound)
    return ScaleRow(devices=devices, cluster=name, stages=problem.stages, replicas=problem.replicas,
                    method=config.methods[0], seconds=float(result.seconds), total_s=total, lower_bound_s=bound,
                    gap=gap(total, bound),
                    bound_source=str(result.details["lower_bound_source"]),
                    bound_seconds=float(result.details["lower_bound_seconds"]), limit_s=config.time_limit_s,
                    wall_s=time.perf_counter() - start)


def bench_cluster(config: ScaleBenchConfig, devices: int) -> Cluster:
    """The cluster of `devices` devices of the config's family (see FAMILIES)."""
    if config.family == "uneven":
        return uneven_regions(devices, config.seed)
    if config.family == "many-region":
        return uneven_six_regions(devices, config.seed)
    jitter = {"uniform": 0.0, "jittered": 0.1}.get(config.family, config.jitter)
    return multicloud(config.regions, devices // config.regions, seed=config.seed, jitter=jitter)


def rows_to_json(config: ScaleBenchConfig, rows: list[ScaleRow]) -> dict[str, Any]:
    return {"config": asdict(config), "rows": [asdict(row) for row in rows]}
