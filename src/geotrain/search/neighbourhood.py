"""Large-neighbourhood search (LNS): keep most of the best plan, re-solve a few stages or regions
exactly with the region path MILP (`anytime`'s "lns" move).

The plan's replica r follows the region path q_r (the regions of its devices, stage by stage). A
neighbourhood frees part of every q_r and keeps the rest:
- "stages": a window W of `width` consecutive stages (random, covering critical stages): inside
  W a replica may take any region, outside it keeps q_r;
- "regions": a set K of `width` + 1 regions (one critical, the others random): a stage whose
  region is in K may take any region of K, the others keep theirs.
Critical (`critical_slots`): where the plan's total is set. When DP >= PP, the stages whose group
term is the largest and the regions of their dearest members; else the slowest replica's regions
(and any window).
The path MILP (`milp.solve_path_milp`) runs over every path the neighbourhood allows for some
replica, with HiGHS started from the plan itself (a point of that MILP: every q_r is allowed), so
its answer is never worse on the region terms. Beyond the freed stages, how many replicas follow
each kept skeleton may change too. The MILP's region plan becomes devices (`keep_devices`: each
stage keeps the plan's devices of a region as far as the new counts allow), is re-wired on the
real links (`wiring.rewire`, never slower) and scored with the real model. On region-uniform
clusters that score is the MILP's objective; elsewhere the region terms are each region pair's
cheapest device pair, the real score may be worse, and such a step is dropped. `width` shrinks
until the allowed paths fit `max_paths` and after a MILP that ran out of its time (at width 1 the
next MILP gets twice the time instead), and grows back (up to the config's) after one solved in
time. A neighbourhood solved without gain is not drawn again until the plan improves (unless every
other one of its kind and width was).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from geotrain.cluster import Cluster
from geotrain.search.base import PlacementProblem, SearchError, SearchResult
from geotrain.search.milp import solve_path_milp
from geotrain.search.regions import RegionTerms, pairwise_or_fail, region_terms
from geotrain.search.wiring import rewire

Options = Callable[[np.ndarray], list[np.ndarray]]
"""For one region path (S,), the regions each stage may take (S arrays)."""


@dataclass(frozen=True)
class NeighbourhoodConfig:
    """width: stages freed by a "stages" neighbourhood (regions freed by a "regions" one: width + 1);
    max_paths: most candidate paths per MILP (width shrinks to fit); step_time_s: most seconds per MILP."""

    width: int = 3
    max_paths: int = 3000
    step_time_s: float = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise SearchError(f"lns: width must be an integer >= 1, got {self.width!r}")
        if isinstance(self.max_paths, bool) or not isinstance(self.max_paths, int) or self.max_paths < 1:
            raise SearchError(f"lns: max_paths must be an integer >= 1, got {self.max_paths!r}")
        if not self.step_time_s > 0:
            raise SearchError(f"lns: step_time_s must be > 0 seconds, got {self.step_time_s!r}")


def stage_window(start: int, width: int, n_regions: int) -> Options:
    """Stages start .. start + width - 1 take any region; the others keep the path's."""
    every = np.arange(n_regions)
    return lambda path: [every if start <= s < start + width else path[s:s + 1] for s in range(len(path))]


def region_set(regions: np.ndarray) -> Options:
    """A stage in one of `regions` takes any of them; the others keep the path's."""
    regions = np.sort(np.asarray(regions, dtype=np.int64))
    return lambda path: [regions if np.isin(g, regions) else path[s:s + 1] for s, g in enumerate(path)]


def neighbourhood_paths(stage_paths: np.ndarray, options: Options, max_paths: int) -> np.ndarray | None:
    """Every region path (P, S) that `options` allows for some replica of stage_paths (S, R) (each
    replica's own path among them), without repeats, in a fixed order; None above max_paths."""
    replica_paths = np.unique(np.asarray(stage_paths, dtype=np.int64).T, axis=0)
    choices = [options(path) for path in replica_paths]
    if sum(int(np.prod([len(c) for c in choice])) for choice in choices) > max_paths:
        return None
    grids = [np.stack(np.meshgrid(*choice, indexing="ij"), axis=-1).reshape(-1, len(choice)) for choice in choices]
    return np.unique(np.concatenate(grids), axis=0)


def keep_devices(cluster: Cluster, plan: np.ndarray, stage_paths: np.ndarray) -> np.ndarray:
    """Devices (S, R) whose replica r follows region path stage_paths[:, r]. Each stage keeps the
    plan's devices of a region (slot by slot where the region is unchanged) up to the new count;
    the rest come from the devices no stage keeps, lowest index first."""
    S, R = stage_paths.shape
    region_of = np.asarray(cluster.region_of)
    kept: list[dict[int, list[int]]] = []
    used: set[int] = set()
    for s in range(S):
        need = np.bincount(stage_paths[s], minlength=cluster.n_regions)
        row: dict[int, list[int]] = {}
        for device in plan[s]:
            g = int(region_of[device])
            if len(row.setdefault(g, [])) < need[g]:
                row[g].append(int(device))
                used.add(int(device))
        kept.append(row)
    free = {g: [int(d) for d in cluster.devices_in_region(g) if int(d) not in used] for g in range(cluster.n_regions)}
    out = np.empty((S, R), dtype=np.int64)
    for s in range(S):
        row = kept[s]
        taken = [False] * R
        for r in range(R):  # a slot whose device stays in its region keeps it
            g, device = int(stage_paths[s, r]), int(plan[s, r])
            if device in row.get(g, []):
                row[g].remove(device)
                out[s, r], taken[r] = device, True
        for r in range(R):
            if not taken[r]:
                g = int(stage_paths[s, r])
                pool = row.get(g) or free[g]
                if not pool:
                    raise SearchError(f"lns: region {cluster.region_names[g]!r} has too few devices for this plan")
                out[s, r] = pool.pop(0)
    return out


def critical_slots(terms: RegionTerms, stage_paths: np.ndarray, dp_s: float,
                   pp_s: float) -> tuple[np.ndarray | None, np.ndarray]:
    """Where the plan's total is set: (stages, regions) to free first. DP at least PP: the stages
    whose group term (region terms) is the largest, ties included, and the regions of their dearest
    members; else no stage (the slowest replica crosses them all) and the slowest replica's regions."""
    if dp_s >= pp_s:
        counts = np.stack([np.bincount(row, minlength=terms.n_regions) for row in stage_paths])
        member = np.where(counts > 0, terms.group_member_seconds(counts), -np.inf)
        top = member >= member.max() - 1e-9 * max(1.0, abs(float(member.max())))
        return np.flatnonzero(top.any(axis=1)), np.unique(np.nonzero(top)[1])
    slowest = int(np.argmax(terms.path_seconds(stage_paths.T)))
    return None, np.unique(stage_paths[:, slowest])


def _neighbourhood(kind: str, terms: RegionTerms, stages: int, width: int, rng: np.random.Generator,
                   critical: tuple[np.ndarray | None, np.ndarray], tried: set[tuple]) -> tuple[tuple, Options]:
    """(key, options): a "stages" window covering as many critical stages as it can (any window,
    without them), or a "regions" set holding one critical region; neighbourhoods in `tried` (solved
    without gain since the last improvement) only when every other one is."""
    critical_stages, regions = critical
    if kind == "stages":
        width = min(width, stages)
        starts = np.arange(stages - width + 1)
        preferred = starts
        if critical_stages is not None:
            offset = critical_stages[None, :] - starts[:, None]
            covered = ((offset >= 0) & (offset < width)).sum(axis=1)
            preferred = starts[covered == covered.max()]
        untried = lambda pool: [int(a) for a in pool if ("stages", int(a), width) not in tried]  # noqa: E731
        start = int(rng.choice(untried(preferred) or untried(starts) or preferred))
        return ("stages", start, width), stage_window(start, width, terms.n_regions)
    size = min(width + 1, terms.n_regions)
    for _ in range(8):
        first = int(rng.choice(regions))
        others = np.setdiff1d(np.arange(terms.n_regions), [first])
        chosen = np.concatenate([[first], rng.choice(others, size=size - 1, replace=False)])
        key = ("regions", tuple(sorted(int(g) for g in chosen)))
        if key not in tried:
            break
    return key, region_set(chosen)


def lns_search(problem: PlacementProblem, config: NeighbourhoodConfig, *, initial: np.ndarray,
               rng: np.random.Generator, time_limit_s: float) -> SearchResult:
    """Improve `initial` by neighbourhood MILPs (module docstring), alternating "stages" and "regions",
    until time_limit_s (seconds) ends or a MILP freeing every stage is solved; returns the best plan
    (`initial` when nothing beat it). details: improvements, and per step [kind, width, paths, status,
    total or None] (status "too many paths": even width 1 allowed more than max_paths)."""
    start = time.perf_counter()
    model, cluster = problem.cost_model, problem.cluster
    pp_pair = pairwise_or_fail(model, "lns").pp_pair_s
    terms = region_terms(cluster, model, "lns")
    S, R = problem.stages, problem.replicas
    best = np.asarray(initial, dtype=np.int64)
    best_cost = model.evaluate(best)
    steps: list[list] = []
    improvements = 0
    widths = {"stages": config.width, "regions": config.width}
    step_s = {"stages": config.step_time_s, "regions": config.step_time_s}
    tried: set[tuple] = set()  # neighbourhoods solved without gain since the last improvement
    while True:
        left = time_limit_s - (time.perf_counter() - start)
        if left < 0.2:
            break
        kind = ("stages", "regions")[len(steps) % 2]
        if len(steps) >= 2 and all(step[3] == "too many paths" for step in steps[-2:]):
            break
        stage_paths = np.asarray(cluster.region_of)[best]
        critical = critical_slots(terms, stage_paths, best_cost.dp, best_cost.pp)
        paths, width = None, widths[kind]
        while paths is None and width >= 1:
            key, options = _neighbourhood(kind, terms, S, width, rng, critical, tried)
            paths = neighbourhood_paths(stage_paths, options, config.max_paths)
            width -= paths is None
        if paths is None:  # even one freed stage or two regions allow too many paths: try the other kind
            steps.append([kind, 0, 0, "too many paths", None])
            continue
        milp = solve_path_milp(terms, S, R, paths, terms.path_seconds(paths), min(step_s[kind], left),
                               initial=stage_paths)
        total = None
        if milp.stage_paths is not None:
            candidate = rewire(pp_pair, keep_devices(cluster, best, milp.stage_paths))
            cost = model.evaluate(candidate)
            total = float(cost.total)
            if cost.total < best_cost.total * (1 - 1e-12):
                best, best_cost, improvements = candidate, cost, improvements + 1
                tried.clear()
            elif milp.status == "optimal":
                tried.add(key)
        steps.append([kind, width, int(len(paths)), milp.status, total])
        if kind == "stages" and width >= S and milp.status == "optimal":
            break  # every stage was free: the plan is optimal on the region terms, nothing left to try
        # a MILP that ran out of time gets a smaller neighbourhood next (more time, at width 1); one
        # solved in time, a larger one
        if milp.status == "time_limit":
            widths[kind] = max(1, width - 1)
            step_s[kind] *= 2.0 if width == 1 else 1.0
        else:
            widths[kind] = min(config.width, width + 1)
    return SearchResult(method="lns", assignment=best, cost=best_cost, seconds=time.perf_counter() - start,
                        evaluations=len(steps), details={"steps": steps, "improvements": improvements})
