"""Lower bounds on the optimal total of a pairwise cost model, valid for any cluster.

Two bounds, the larger is reported:
- combinatorial (instant): every used device d has dp_s >= m_d = the sum of its R - 1 cheapest dp
  pairs, and S x R devices are used, so DP >= the (S R)-th smallest m_d. A replica path costs at least
  half the cheapest pp pair of each end device plus the cheapest pair of each inner device, so the
  mean (hence the max) replica is at least the cheapest such weighting of S R devices, over R.
- region relaxation: the region MILP (`milp`) on region terms that take the cheapest device pair of
  every region pair (exact for region-uniform clusters, a relaxation otherwise). With few enough
  candidate region paths this is the path model (its optimum, or its dual bound at the time limit);
  with more, the path model over the paths of cost <= c bounds the rest by c + DP lower bound
  (`exact.solve_region_problem`);
  and, unless that solved to optimality, the layered-composition model (`layers`) when few region
  compositions can beat the best known plan (they share the time limit); the flow model when
  neither applies. MILP bounds are deflated by milp.BOUND_SAFETY (1e-7 relative).
- the path staircase (`path_stairs`, first, PATH_STAIRS_SHARE of the time at most): plans are split
  by PP from `milp.pp_floor` (the cheapest path, or the cheapest crossing path where region sizes
  force replicas to cross) and each low piece is bounded by the path MILP over its few paths; it
  splits the plans at a PP value `split` below which every plan costs >= `below`, and the two
  staircases below bound only plans with PP >= split (their parts are min(below, staircase)).
- staircases (`staircase`): plans are split by their pipeline seconds and DP is bounded inside
  each piece (a small cut-flow model, then a layered region-path graph); this runs next, with a
  third of the time left at most, and when a part comes within STAIRCASE_TARGET_GAP of the known plan
  only the path model runs after it. Otherwise, unless the path model is solved to optimality (it
  gets half of the time left), plans are also split by DP with the mean replica's pipeline seconds
  bounded inside each piece; the layer (else flow) relaxation and this staircase share the time left.
  Every piece [a, b) carries the cap U - a on its other term (a plan of the piece above it costs >= U),
  which is what lets HiGHS prove most pieces quickly (`staircase`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from geotrain.cost import PairwiseTerms
from geotrain.search.base import PlacementProblem, SearchResult
from geotrain.search.exact import simple_upper_bound, solve_region_problem
from geotrain.search.layers import enumerate_compositions, solve_layer_milp
from geotrain.search.milp import pp_floor, solve_flow_milp
from geotrain.search.path_stairs import path_staircase_bound
from geotrain.search.regions import RegionTerms, pairwise_or_fail, region_terms
from geotrain.search.staircase import staircase_bound
from geotrain.search.watchdog import run_with_deadline

STAIRCASE_TARGET_GAP = 0.002
"""The first staircases' target (`staircase_bound`): once reached, the flow, layer and DP staircase
bounds are skipped (the path model still runs: it may prove the optimum itself)."""


PATH_STAIRS_SHARE = 0.25
"""Share of the region bounds' time for the path staircase (`path_stairs`), which runs first."""


MIN_REGION_TIME_S = 1.0
"""Below this time limit (seconds) only the combinatorial bound is computed."""


@dataclass(frozen=True)
class LowerBound:
    """value_s: the bound (seconds); source: which bound it is; parts: every bound computed (seconds);
    proven_optimal: the region MILP was solved to optimality on exact (region-uniform) terms, so the
    bound is the optimum itself; killed: the guarded child was ended at the time limit."""

    value_s: float
    source: str
    parts: dict[str, float] = field(default_factory=dict)
    proven_optimal: bool = False
    seconds: float = 0.0
    killed: bool = False

    def gap(self, total_s: float) -> float:
        """(total - bound) / total, >= 0."""
        return gap(total_s, self.value_s)


def gap(total_s: float, bound_s: float) -> float:
    """The certified gap of a plan of `total_s` under a lower bound `bound_s`: (total - bound) / total, >= 0."""
    return max(0.0, (total_s - bound_s) / total_s) if total_s > 0 else 0.0


def combinatorial_dp_bound(dp_pair_s: np.ndarray, stages: int, replicas: int) -> float:
    """A bound on max_s dp_s (seconds): the (S R)-th smallest sum of a device's R - 1 cheapest pairs."""
    n = dp_pair_s.shape[0]
    if replicas < 2:
        return 0.0
    off = ~np.eye(n, dtype=bool)
    rows = np.partition(dp_pair_s[off].reshape(n, n - 1), replicas - 2, axis=1)[:, : replicas - 1].sum(axis=1)
    return float(np.partition(rows, stages * replicas - 1)[stages * replicas - 1])


def combinatorial_bound(terms: PairwiseTerms, stages: int, replicas: int) -> float:
    """DP and PP bounds from per-device cheapest pairs (see the module docstring), seconds."""
    n = terms.dp_pair_s.shape[0]
    off = ~np.eye(n, dtype=bool)
    used = stages * replicas
    dp = combinatorial_dp_bound(terms.dp_pair_s, stages, replicas)
    pp = 0.0
    if stages > 1:
        cheapest = np.sort(terms.pp_pair_s[off].reshape(n, n - 1).min(axis=1))[:used]
        weights = np.concatenate([np.ones(replicas * (stages - 2)), np.full(2 * replicas, 0.5)])
        pp = float(cheapest @ weights) / replicas
    return dp + pp


def lower_bound(problem: PlacementProblem, *, upper_bound_s: float | None = None, time_limit_s: float = 30.0,
                max_paths: int = 20000, max_compositions: int = 400, staircase: bool = True,
                guard: bool = False, cancel: threading.Event | None = None) -> LowerBound:
    """The best of the bounds above. `upper_bound_s`: the total of any known plan (prunes region paths).
    guard: run the region MILPs in a child process that is ended at time_limit_s (+ `watchdog.GRACE_S`),
    keeping every part it proved by then (`watchdog`), so the limit holds even if HiGHS overruns;
    `cancel` (guarded only): set by another thread, it ends the child early the same way."""
    start = time.perf_counter()
    model = problem.cost_model
    terms = pairwise_or_fail(model, "a lower bound")
    S, R = problem.stages, problem.replicas
    parts = {"combinatorial": combinatorial_bound(terms, S, R)}
    regions = region_terms(problem.cluster, model, "a lower bound")
    if S * R <= 1:
        return LowerBound(parts["combinatorial"], "combinatorial", parts, True, time.perf_counter() - start)
    upper = simple_upper_bound(regions, S, R)
    if upper_bound_s is not None:
        upper = min(upper, float(upper_bound_s))
    options = (max_paths, max_compositions, staircase and S > 1)
    if time_limit_s < MIN_REGION_TIME_S:  # no time for the region models (a guarded child alone starts in ~1 s)
        return LowerBound(parts["combinatorial"], "combinatorial", parts, False, time.perf_counter() - start)
    if guard:
        left_s = max(0.0, time_limit_s - (time.perf_counter() - start))
        run = run_with_deadline(_region_bound_child, (regions, S, R, upper, time.time() + left_s, options), left_s,
                                cancel=cancel)
        reported = [item for item in run.items if isinstance(item, tuple)]
        proven, killed = run.finished and bool(run.items[-1]), run.killed
    else:
        reported, killed = [], False
        proven = _region_bounds(reported.append, regions, S, R, upper, time_limit_s, *options)
    parts.update(dict(reported))
    source = max(parts, key=parts.get)
    return LowerBound(parts[source], source, parts, proven and source == "region-paths", time.perf_counter() - start,
                      killed)


def _region_bound_child(report, regions: RegionTerms, stages: int, replicas: int, upper: float, deadline_wall: float,
                        options: tuple[int, int, bool]) -> bool:
    """`_region_bounds` in the watchdog's child, with the time left until the parent's deadline."""
    return _region_bounds(report, regions, stages, replicas, upper, max(0.1, deadline_wall - time.time()), *options)


def _region_bounds(report, regions: RegionTerms, S: int, R: int, upper: float, time_limit_s: float, max_paths: int,
                   max_compositions: int, staircase: bool) -> bool:
    """The region bounds of the module docstring, each sent as report((name, seconds)) once proven;
    returns True when the path model proved the region optimum on exact terms."""
    start = time.perf_counter()
    parts: dict[str, float] = {}

    def found(name: str, value: float) -> None:
        parts[name] = float(value)
        report((name, float(value)))

    left = lambda share: max(0.1, share * (time_limit_s - (time.perf_counter() - start)))  # noqa: E731
    pp_low = pp_floor(regions, S, R)
    split, below = pp_low, upper  # every plan has PP >= split or total >= below
    if staircase:  # these often settle the bound in seconds: first, with a quarter and a third of the time left
        path = path_staircase_bound(regions, S, R, upper, time_limit_s=left(PATH_STAIRS_SHARE))
        found("path-stairs", path.bound_s)
        split, below = path.split_s, path.below_s
        found("staircase-pp", min(below, staircase_bound(regions, S, R, upper, axis="pp", time_limit_s=left(1.0 / 3.0),
                                                         pp_low_s=split).bound_s))
    settled = staircase and max(parts.values()) >= upper * (1.0 - STAIRCASE_TARGET_GAP)
    compositions = enumerate_compositions(regions, R, upper - pp_low, max_compositions)
    if compositions is not None and not len(compositions):
        compositions = None
    try:
        solution = solve_region_problem(regions, S, R, max_paths=max_paths, upper_bound_s=upper,
                                        time_limit_s=left(0.5 if (compositions is not None or staircase) and not settled
                                                          else 1.0))
    except ValueError:  # SearchError: no plan over the cheapest paths
        solution = None
    solved = False
    if solution is not None:  # complete or with lazily generated paths: bound_s holds either way
        found("region-paths", solution.bound_s)
        solved = solution.complete and solution.milp.status == "optimal"  # the region optimum: nothing beats it
    # unless the path model or the first staircase settled it, the layer/flow relaxations share the
    # time left with the DP staircase
    with_staircase = staircase and not solved and not settled
    share = 0.5 if with_staircase else 1.0
    if not solved and not settled and compositions is not None:
        found("region-layers", solve_layer_milp(regions, S, R, compositions, left(share)).bound)
    complete = solution is not None and solution.complete
    if not solved and not settled and not complete and "region-layers" not in parts:
        # plans with DP above U - (pipeline floor) cost more than U: min(bound, U) holds for all plans
        dp_cap = upper - pp_low
        found("region-flows", min(upper, solve_flow_milp(regions, S, R, left(share), dp_cap_s=dp_cap).bound))
    if with_staircase:
        found("staircase-dp", min(below, staircase_bound(regions, S, R, upper, axis="dp", time_limit_s=left(1.0),
                                                         pp_low_s=split).bound_s))
    return regions.exact and solved


def with_lower_bound(problem: PlacementProblem, result: SearchResult, time_limit_s: float = 30.0, *,
                     guard: bool = True) -> SearchResult:
    """`result` with `lower_bound` set to the best of its own bound and `lower_bound(problem)` (guarded:
    back within time_limit_s + `watchdog.GRACE_S`); details gain "lower_bound_source",
    "lower_bound_parts", "lower_bound_seconds" and "lower_bound_killed"."""
    return with_bound(result, lower_bound(problem, upper_bound_s=result.cost.total, time_limit_s=time_limit_s,
                                          guard=guard))


def with_bound(result: SearchResult, bound: LowerBound) -> SearchResult:
    """`result` with `lower_bound` set to the best of its own bound and `bound` (with_lower_bound's details)."""
    own = result.lower_bound if result.lower_bound is not None else -np.inf
    value = max(own, bound.value_s)
    source = result.method if own >= bound.value_s else bound.source
    details = {**result.details, "lower_bound_source": source, "lower_bound_parts": bound.parts,
               "lower_bound_seconds": bound.seconds, "lower_bound_killed": bound.killed}
    return replace(result, lower_bound=value, details=details)
