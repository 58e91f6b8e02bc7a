"""Hand-made placements from the seed: keep one kind of traffic inside regions.

- `pipeline-local`: whole pipelines (all S stages of a replica) inside one region; DP groups span
  regions. A region of n devices holds n // S pipelines. Which regions host how many pipelines
  changes the cost, so every distribution (count per region, within capacity) is scored with the
  cost model when there are at most `max_candidates` of them; otherwise regions are filled largest
  capacity first (fewest regions in each DP group).
- `dp-local`: each stage's DP group (its R devices) inside one region; pipelines cross regions.
  A region of n devices holds n // R groups. Which region serves which stage sets the pipeline's
  region path, so every stage -> region map within capacity is scored with the cost model when
  there are at most `max_candidates`; otherwise a greedy path follows the cheapest next link.

When regions cannot hold all pipelines / groups whole, the rest "spill": they are filled from the
leftover devices in region order, so each spilled unit crosses as few regions as possible.
Inside a region, devices are taken in ascending index order. On `seed-geo` (4 regions x 8, S=4,
R=8) pipeline-local is the seed's plan (replicas 2k, 2k+1 in region k) and dp-local puts each
stage in its own region, in the best of the 24 region orders.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from geotrain.cluster import Cluster
from geotrain.search.base import PlacementProblem, ProgressCallback, SearchError, SearchResult


@dataclass(frozen=True)
class RegionHeuristicConfig:
    """max_candidates: score at most this many region choices with the cost model (else greedy)."""

    max_candidates: int = 20000

    def __post_init__(self) -> None:
        if isinstance(self.max_candidates, bool) or not isinstance(self.max_candidates, int) or self.max_candidates < 1:
            raise SearchError(f"max_candidates must be an integer >= 1, got {self.max_candidates!r}")


def _bounded_compositions(total: int, caps: Sequence[int], limit: int) -> list[tuple[int, ...]] | None:
    """All count vectors c with 0 <= c[g] <= caps[g] and sum c = total, or None if more than `limit`."""
    found: list[tuple[int, ...]] = []
    suffix = np.concatenate([np.cumsum(np.asarray(caps)[::-1])[::-1], [0]])

    def walk(g: int, left: int, prefix: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if g == len(caps):
            if left == 0:
                yield prefix
            return
        for count in range(min(caps[g], left), -1, -1):
            if left - count <= suffix[g + 1]:
                yield from walk(g + 1, left - count, prefix + (count,))

    for vector in walk(0, total, ()):
        found.append(vector)
        if len(found) > limit:
            return None
    return found


def _bounded_sequences(length: int, caps: Sequence[int], limit: int) -> list[tuple[int, ...]] | None:
    """All region sequences of `length` using region g at most caps[g] times, or None if more than `limit`."""
    found: list[tuple[int, ...]] = []
    left = list(caps)
    usable = [g for g, cap in enumerate(caps) if cap > 0]

    def walk(prefix: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if len(prefix) == length:
            yield prefix
            return
        for g in usable:
            if left[g] > 0:
                left[g] -= 1
                yield from walk(prefix + (g,))
                left[g] += 1

    for sequence in walk(()):
        found.append(sequence)
        if len(found) > limit:
            return None
    return found


def _units_from_regions(cluster: Cluster, regions: Sequence[int], unit_size: int, n_units: int) -> np.ndarray:
    """(n_units, unit_size) device blocks: one whole block from each listed region in turn (the next
    unused devices of that region), then spilled blocks from the leftover devices in region order."""
    pools = [list(cluster.devices_in_region(g)) for g in range(cluster.n_regions)]
    units = []
    for g in regions:
        units.append(pools[g][:unit_size])
        del pools[g][:unit_size]
    leftover = [d for pool in pools for d in pool]
    while len(units) < n_units:
        if len(leftover) < unit_size:
            raise SearchError(f"not enough devices left to build {n_units} units of {unit_size}")
        units.append(leftover[:unit_size])
        del leftover[:unit_size]
    return np.asarray(units, dtype=np.int64)


def pipeline_local_assignment(cluster: Cluster, stages: int, replicas: int, counts: Sequence[int]) -> np.ndarray:
    """(S, R) assignment with counts[g] whole pipelines in region g, replicas in region order."""
    regions = [g for g, count in enumerate(counts) for _ in range(count)]
    return _units_from_regions(cluster, regions, stages, replicas).T


def dp_local_assignment(cluster: Cluster, stages: int, replicas: int, stage_regions: Sequence[int]) -> np.ndarray:
    """(S, R) assignment whose first len(stage_regions) stages each hold one whole region's DP group."""
    return _units_from_regions(cluster, stage_regions, replicas, stages)


def _best(problem: PlacementProblem, candidates: np.ndarray) -> tuple[int, np.ndarray]:
    totals = problem.cost_model.evaluate_many(candidates)
    return int(np.argmin(totals)), totals


def _check(problem: PlacementProblem) -> None:
    if problem.stages * problem.replicas > problem.n_devices:
        raise SearchError(f"{problem.stages} x {problem.replicas} slots do not fit {problem.n_devices} devices")


def pipeline_local(problem: PlacementProblem, config: RegionHeuristicConfig, *, seed: int = 0,
                   time_limit_s: float | None = None, progress: ProgressCallback | None = None) -> SearchResult:
    """Whole pipelines inside regions; the best region distribution by the cost model. Deterministic."""
    start = time.perf_counter()
    _check(problem)
    cluster, stages, replicas = problem.cluster, problem.stages, problem.replicas
    caps = (cluster.region_sizes() // stages).tolist()
    whole = min(replicas, sum(caps))
    vectors = _bounded_compositions(whole, caps, config.max_candidates)
    exhaustive = vectors is not None
    if vectors is None:  # too many: fill the largest regions first
        left, greedy = whole, [0] * len(caps)
        for g in sorted(range(len(caps)), key=lambda g: (-caps[g], g)):
            greedy[g] = min(caps[g], left)
            left -= greedy[g]
        vectors = [tuple(greedy)]
    candidates = np.stack([pipeline_local_assignment(cluster, stages, replicas, v) for v in vectors])
    best, totals = _best(problem, candidates)
    if progress is not None:
        progress(1, 1)
    return SearchResult(
        method="pipeline-local", assignment=candidates[best], cost=problem.cost_model.evaluate(candidates[best]),
        seconds=time.perf_counter() - start, evaluations=len(candidates),
        details={"pipelines_per_region": list(vectors[best]), "spilled_pipelines": replicas - whole,
                 "candidates": len(candidates), "exhaustive": exhaustive},
    )


def _region_mean_gbps(cluster: Cluster) -> np.ndarray:
    """G x G mean bandwidth (Gbit/s) between devices of two regions (off-diagonal pairs inside one)."""
    n_regions = cluster.n_regions
    means = np.zeros((n_regions, n_regions))
    off = ~np.eye(cluster.n_devices, dtype=bool)
    for a in range(n_regions):
        for b in range(n_regions):
            block = np.ix_(cluster.region_of == a, cluster.region_of == b)
            values = cluster.bandwidth_gbps[block][off[block]]
            means[a, b] = values.mean() if values.size else 0.0
    return means


def _greedy_stage_regions(cluster: Cluster, count: int, caps: list[int]) -> list[int]:
    """Start in the region with the most capacity, then always step to the fastest link with room."""
    left = list(caps)
    current = max(range(len(caps)), key=lambda g: (left[g], -g))
    path = [current]
    left[current] -= 1
    region_gbps = _region_mean_gbps(cluster)
    while len(path) < count:
        options = [g for g in range(len(caps)) if left[g] > 0]
        current = max(options, key=lambda g: (g == current, region_gbps[current, g], -g))
        path.append(current)
        left[current] -= 1
    return path


def dp_local(problem: PlacementProblem, config: RegionHeuristicConfig, *, seed: int = 0,
             time_limit_s: float | None = None, progress: ProgressCallback | None = None) -> SearchResult:
    """Each stage's DP group inside a region; the best stage -> region map by the cost model. Deterministic."""
    start = time.perf_counter()
    _check(problem)
    cluster, stages, replicas = problem.cluster, problem.stages, problem.replicas
    caps = (cluster.region_sizes() // replicas).tolist()
    whole = min(stages, sum(caps))
    # Spilled stages go last: the greedy/exhaustive choice covers the first `whole` stages.
    sequences = _bounded_sequences(whole, caps, config.max_candidates)
    exhaustive = sequences is not None
    if sequences is None:
        sequences = [tuple(_greedy_stage_regions(cluster, whole, caps))]
    candidates = np.stack([dp_local_assignment(cluster, stages, replicas, seq) for seq in sequences])
    best, totals = _best(problem, candidates)
    identity = tuple(range(whole)) if whole <= cluster.n_regions else None
    identity_total = float(totals[sequences.index(identity)]) if identity in sequences else None
    if progress is not None:
        progress(1, 1)
    return SearchResult(
        method="dp-local", assignment=candidates[best], cost=problem.cost_model.evaluate(candidates[best]),
        seconds=time.perf_counter() - start, evaluations=len(candidates),
        details={"stage_regions": [cluster.region_names[g] for g in sequences[best]],
                 "spilled_stages": stages - whole, "candidates": len(candidates), "exhaustive": exhaustive,
                 "in_order_total": identity_total},
    )
