"""The path staircase: split plans by PP, bound each piece by the path MILP over the few paths it allows.

Break points c_0 < c_1 < ... < c_K with c_0 = `milp.pp_floor` (<= every plan's PP). A plan of total
< U (a known plan's total) whose PP lies in [c_k, c_{k+1}) uses only region paths of cost <= c_{k+1}
and has DP < U - c_k, so it is a point of the path MILP over those paths with DP <= U - c_k
(`milp.solve_path_milp`, dp_cap_s), and its total is >= that MILP's dual bound B_k (valid whenever
HiGHS stops; infeasible: no such plan, B_k = U). A plan with PP >= c_k has total >= c_k + DPlb
(`exact.dp_lower_bound`, valid for plans of total <= U). Hence, for every k,
    OPT >= min(U, B_0, ..., B_{k-1}, c_k + DPlb),
and the bound is the largest of these over the pieces solved in time (k = 0: c_0 + DPlb). Each k
also splits the plans: a plan has total >= min(U, B_0, ..., B_{k-1}) (`below_s`) or PP >= c_k
(`split_s`), so a bound over plans with PP >= c_k (the staircases of `staircase`, started there) and
below_s bound every plan together. The split kept is the largest c_k whose pieces all reach U
(within SETTLED_GAP), so that below_s never caps what the staircases prove above it.

Why it helps: the layered-composition model's LP relaxation (which column generation would solve)
is weaker than the bounds it would join at 256-512 devices (docs/history/placement.md), and the flow models'
presence rows leave the LP at the DP floor; the path MILP over a few hundred paths (integer path
counts, the mean-replica row) proves far more in the same seconds, and where the region sizes force
replicas to cross regions c_0 already sits near the plans' PP. The break points put at most
PIECE_PATHS[k] paths (cumulative) under c_{k+1}.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from geotrain.search.exact import dp_lower_bound, paths_below
from geotrain.search.milp import pp_floor, solve_path_milp
from geotrain.search.regions import RegionTerms

PIECE_PATHS = (250, 500, 1000, 2000, 4000)
"""Region paths (cumulative) of each piece's MILP at most: small MILPs first."""
SETTLED_GAP = 1e-6
"""A piece whose bound is within this fraction of U counts as settled (holds no plan below U)."""
MIN_POTENTIAL = 0.5
"""Pieces past the first unsettled one run only if c_K + DPlb (the most they can prove) reaches this
share of U and DPlb reaches MIN_DP_SHARE of it (a time rule: every bound returned is valid either way)."""
MIN_DP_SHARE = 0.2
DP_SHARE = 0.1
"""Share of the time limit for `exact.dp_lower_bound` (the tail's DP bound)."""


@dataclass(frozen=True)
class PathStaircase:
    """bound_s: the lower bound (seconds); pieces: (c_k, c_{k+1}, B_k, paths) in order; dp_low_s: DPlb;
    complete: the last break point reached U - DPlb (nothing left above it) with every piece solved;
    split_s, below_s: every plan has PP >= split_s or total >= below_s (see the module docstring)."""

    bound_s: float
    pieces: tuple[tuple[float, float, float, int], ...]
    dp_low_s: float
    complete: bool
    seconds: float
    split_s: float
    below_s: float


def path_staircase_bound(terms: RegionTerms, stages: int, replicas: int, upper_bound_s: float, *,
                         time_limit_s: float = 30.0, piece_paths: tuple[int, ...] = PIECE_PATHS) -> PathStaircase:
    """OPT >= the returned bound (see the module docstring); upper_bound_s: a known plan's total."""
    start = time.perf_counter()
    left = lambda: time_limit_s - (time.perf_counter() - start)  # noqa: E731
    upper = float(upper_bound_s)
    low = pp_floor(terms, stages, replicas)
    dp_low = dp_lower_bound(terms, stages, replicas, upper, DP_SHARE * time_limit_s)
    top = upper - dp_low  # a plan with PP >= top costs >= U
    best = min(upper, low + dp_low)
    pieces: list[tuple[float, float, float, int]] = []
    if stages < 2 or low >= top:
        return PathStaircase(best, (), dp_low, low >= top, time.perf_counter() - start, low, upper)
    points = [low]
    for budget in piece_paths:  # break points: the largest c within each budget of paths
        paths, _, cap = paths_below(terms, stages, top, budget)
        if cap > points[-1] * (1 + 1e-9) + 1e-12:
            points.append(cap)
        if cap >= top:
            break
    below = upper  # min of B_0 .. B_{k-1}
    finished = True
    # past the first piece that does not reach U, only c_k + DPlb can still lift the bound: when DPlb
    # is a small share of U (equal regions: pure stages are cheap) or even the last break point leaves
    # it below MIN_POTENTIAL x U, the staircases make better use of the time
    promising = dp_low >= MIN_DP_SHARE * upper and points[-1] + dp_low >= MIN_POTENTIAL * upper
    for k in range(len(points) - 1):
        a, b = points[k], points[k + 1]
        seconds = left() / (len(points) - 1 - k)
        unsettled = below < upper * (1.0 - SETTLED_GAP)
        if seconds <= 0.05 or below <= best or (unsettled and not promising):
            finished = False  # no time, no later prefix can beat the best one, or none can go far
            break
        paths, path_s, _ = paths_below(terms, stages, b, 10 ** 9)
        result = solve_path_milp(terms, stages, replicas, paths, path_s, seconds, dp_cap_s=upper - a)
        value = upper if result.status == "infeasible" else min(upper, result.bound)
        finished &= result.status != "time_limit"
        pieces.append((a, b, value, len(paths)))
        below = min(below, value)
        best = max(best, min(below, b + dp_low))
    complete = finished and len(pieces) == len(points) - 1 and points[-1] >= top
    split = low
    for a, b, value, _ in pieces:  # the largest split below which every plan costs >= U
        if value < upper * (1.0 - SETTLED_GAP):
            break
        split = b
    return PathStaircase(float(best), tuple(pieces), dp_low, complete, time.perf_counter() - start, split,
                         upper * (1.0 - SETTLED_GAP))
