"""Staircase lower bounds: split plans by one term of total = DP + PP, bound the other in each piece.

total = DP + PP with DP = max_s dp_s and PP = max_r pp_r. For a threshold B let DP*(B) be the least
DP of a plan whose every replica path costs <= B; DP*(B) does not grow with B. Every plan with PP in
[a, b) has total >= a + DP*(b), so for break points a_0 < a_1 < ... < a_K (a_0: `milp.pp_floor`,
at least the cheapest region path; a_K: U - dp floor, beyond which no plan beats a known plan of total U)
    OPT >= min_k (a_k + DPlb(a_{k+1}))   and   OPT >= min(U, a_K + dp floor),
with DPlb(b) <= DP*(b) the dual bound of `solve_dp_milp`. The range starts as `pieces_at_start` even
pieces (cheapest first, each MILP with an even share of the time left); then the piece holding the
minimum is split at its middle until the bound is within `target_gap` of U or the time is spent.

`solve_dp_milp(b)` minimises DP over region counts x[s, g] (integer), presence y[s, g] (binary) and
replica flows on a layered region graph whose nodes (s, g, c) carry the path's seconds so far, in
units of delta and rounded down arc by arc: a path of cost <= b keeps sum floor(pp / delta) <=
floor(b / delta), so the flows cover every plan with PP <= b (and a few slightly dearer paths: a
relaxation, so the bound stays valid); pp is then not in the objective, so no binaries are needed
on paths. Flows are continuous (a further relaxation); x, y are integer, with the same DP rows as
the region MILPs (`milp._group_rows`: DP >= f_g(x_s) where region g is present, DP >= dp floor).

The other axis (axis="dp") splits plans by DP instead: pieces [a, b) of DP worth a + PPlb(b), with
PPlb(b) the least mean replica pipeline seconds (<= PP) over plans with DP <= b
(`solve_mean_pp_milp`). Knowing DP <= b lets a present region's count start at `least_presence`
(a member's foreign peers cost it at least its cheapest step each), which is what makes it strong
where stage groups must stay inside regions (equal regions of R devices: multicloud).

Caps: a plan of piece [a, b) whose other term is >= U - a costs >= U, so each piece's MILP only
represents plans with the other term <= U - a (DP <= U - a with `least_presence` rows on the pp
axis; every replica <= U - a on the dp axis, so the mean too, and no flow on a cut that no such
replica crosses). Its value is a + min(bound, U - a) (infeasible: a + U - a = U), which stays below
every plan of the piece, and min(bound, U - a) still cannot grow with b, so the carry above holds.
The cap turns the pieces near U into feasibility questions that HiGHS mostly settles at the root
(`highs.solve_milp` keeps the dual bound when the time ends without a feasible solution, as it
often does in a capped piece). Each pp piece first runs `solve_dp_flow_milp` (the dp axis's
cut-flow model with the mean replica <= b and DP minimised: a few hundred columns) with a third of
its time, and the layered graph only if that did not settle the piece.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from geotrain.search.milp import (MilpResult, _bound, _flow_conservation_rows, _group_rows, _Rows, _solve,
                                  _solve_for_counts, _status, cheapest_into_out, pp_floor)
from geotrain.search.regions import RegionTerms, dp_floor

LEVELS = 160
"""Cost levels of the layered graph at threshold b (delta = b / LEVELS): finer is tighter and larger."""
MAX_ARCS = 60_000
"""Arcs of the layered graph at most; above, delta doubles (coarser, still a valid relaxation)."""


@dataclass(frozen=True)
class LayeredGraph:
    """Arcs (s, tail node, head node) of the layered region graph; node k sits at stage
    node_stage[k] in region node_region[k]. delta_s: the seconds of one cost unit."""

    node_stage: np.ndarray
    node_region: np.ndarray
    arc_stage: np.ndarray
    arc_tail: np.ndarray
    arc_head: np.ndarray
    delta_s: float


def layered_graph(terms: RegionTerms, stages: int, cap_s: float, delta_s: float) -> LayeredGraph | None:
    """The graph of region paths whose rounded-down seconds stay <= cap_s (see the module docstring);
    None when it would have more than MAX_ARCS arcs."""
    G = terms.n_regions
    units = np.floor(terms.pp_s / delta_s - 1e-9).clip(min=0).astype(np.int64)  # never above the true units
    cap = int(np.floor(cap_s / delta_s + 1e-9))
    suffix = np.zeros((stages, G), dtype=np.int64)  # cheapest rounded k-cut path from g
    for k in range(1, stages):
        suffix[k] = (units + suffix[k - 1][None, :]).min(axis=1)
    keep = suffix[stages - 1] <= cap
    regions, costs = np.flatnonzero(keep), np.zeros(int(keep.sum()), dtype=np.int64)
    node_stage, node_region = [np.zeros(regions.size, dtype=np.int64)], [regions]
    arcs_s, arcs_t, arcs_h = [], [], []
    first = 0
    for s in range(1, stages):
        tail = np.repeat(np.arange(regions.size), G)
        head_region = np.tile(np.arange(G), regions.size)
        head_cost = costs[tail] + units[regions[tail], head_region]
        ok = head_cost + suffix[stages - 1 - s][head_region] <= cap
        tail, head_region, head_cost = tail[ok], head_region[ok], head_cost[ok]
        key = head_region * (cap + 1) + head_cost
        unique, head = np.unique(key, return_inverse=True)
        next_first = first + regions.size
        arcs_s.append(np.full(tail.size, s - 1))
        arcs_t.append(first + tail)
        arcs_h.append(next_first + head)
        if sum(a.size for a in arcs_t) > MAX_ARCS:
            return None
        regions, costs, first = unique // (cap + 1), unique % (cap + 1), next_first
        node_stage.append(np.full(regions.size, s))
        node_region.append(regions)
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)  # noqa: E731
    return LayeredGraph(cat(node_stage), cat(node_region), cat(arcs_s), cat(arcs_t), cat(arcs_h), delta_s)


def solve_dp_milp(terms: RegionTerms, stages: int, replicas: int, cap_s: float,
                  time_limit_s: float | None = None, *, dp_cap_s: float = np.inf) -> MilpResult | None:
    """Lower bound on DP*(cap_s) (see the module docstring; status "infeasible", bound inf: no plan
    has PP <= cap_s and DP <= dp_cap_s); None when the graph stays too large."""
    delta = max(cap_s, 1e-9) / LEVELS
    graph = layered_graph(terms, stages, cap_s, delta)
    while graph is None and delta < cap_s:
        delta *= 2.0
        graph = layered_graph(terms, stages, cap_s, delta)
    if graph is None:
        return None
    G, A = terms.n_regions, graph.arc_tail.size
    f0 = 2 * stages * G
    dp_col = f0 + A
    n_vars = dp_col + 1
    rows = _Rows()
    _group_rows(rows, terms, stages, replicas, dp_col, dp_cap_s)
    n_nodes = graph.node_stage.size
    out_arcs = [[] for _ in range(n_nodes)]
    in_arcs = [[] for _ in range(n_nodes)]
    for a, (t, h) in enumerate(zip(graph.arc_tail.tolist(), graph.arc_head.tolist())):
        out_arcs[t].append(a)
        in_arcs[h].append(a)
    for k in range(n_nodes):
        s = int(graph.node_stage[k])
        if 0 < s < stages - 1:  # conservation at inner nodes
            coefficients = {f0 + a: 1.0 for a in in_arcs[k]}
            for a in out_arcs[k]:
                coefficients[f0 + a] = coefficients.get(f0 + a, 0.0) - 1.0
            rows.add(coefficients, 0.0, 0.0)
    for s in range(stages):  # the flow through stage s's nodes of region g is x[s, g]
        for g in range(G):
            nodes = np.flatnonzero((graph.node_stage == s) & (graph.node_region == g))
            arcs = [a for k in nodes for a in (out_arcs[k] if s < stages - 1 else in_arcs[k])]
            coefficients = {f0 + a: 1.0 for a in arcs}
            coefficients[s * G + g] = -1.0
            rows.add(coefficients, 0.0, 0.0)
    c = np.zeros(n_vars)
    c[dp_col] = 1.0
    integrality = np.zeros(n_vars)
    integrality[:f0] = 1
    upper = np.concatenate([np.minimum(np.repeat(terms.sizes[None, :], stages, 0).ravel(), replicas),
                            np.ones(stages * G), np.full(A, float(replicas)), [np.inf]]).astype(float)
    return _solve_for_counts(c, rows, integrality, upper, n_vars, time_limit_s, stages, G)


@dataclass(frozen=True)
class Staircase:
    """bound_s: the lower bound (seconds); pieces: (a, b, bound of the piece) in order of a;
    solves: DP MILPs run; complete: every piece's DP bound came from a finished (optimal or
    infeasible) MILP."""

    bound_s: float
    pieces: tuple[tuple[float, float, float], ...]
    solves: int
    complete: bool
    seconds: float


def _stairs(low: float, top: float, upper_bound_s: float, inner, floor: float, time_limit_s: float,
            target_gap: float, min_width_s: float, pieces_at_start: int) -> Staircase:
    """The staircase over one axis: pieces [a, b) of the split term worth a + inner(b), inner(b) a
    lower bound on the other term over plans whose split term is <= b (non-increasing in b; at least
    `floor`); inner(a, b, floor, seconds) -> (value, finished), where the value may be capped at
    U - a (plans of the piece above it cost >= U: see `staircase_bound`)."""
    start = time.perf_counter()
    solves, complete = 0, True

    def solve(a: float, cap: float, lower: float, left: float) -> float:
        nonlocal solves, complete
        value, finished = inner(a, cap, lower, max(0.05, left))
        solves += 1
        complete &= finished
        return value

    # the cheap (small b) pieces are solved first, each with an even share of the time left
    points = np.linspace(low, top, pieces_at_start + 1)
    pieces = []
    for k in range(pieces_at_start):
        share = (time_limit_s - (time.perf_counter() - start)) / (pieces_at_start - k)
        a, b = float(points[k]), float(points[k + 1])
        if share <= 0:  # out of time: a + floor still bounds every plan of the piece
            complete = False
            pieces.append((a, b, a + floor))
            continue
        pieces.append((a, b, a + solve(a, b, floor, share)))
    # inner(b) can only fall as b grows: carry the larger value of a later piece to earlier ones
    for k in range(len(pieces) - 2, -1, -1):
        a, b, value = pieces[k]
        pieces[k] = (a, b, max(value, a + pieces[k + 1][2] - pieces[k + 1][0]))
    target = upper_bound_s * (1.0 - target_gap)
    while time.perf_counter() - start < time_limit_s:
        k = min(range(len(pieces)), key=lambda i: pieces[i][2])
        a, b, value = pieces[k]
        if value >= target or b - a < min_width_s:
            break
        middle = 0.5 * (a + b)
        inner_b = value - a
        left = time_limit_s - (time.perf_counter() - start)
        pieces[k:k + 1] = [(a, middle, a + solve(a, middle, inner_b, left)), (middle, b, middle + inner_b)]
    value = min(upper_bound_s, min(p[2] for p in pieces))
    return Staircase(value, tuple(pieces), solves, complete, time.perf_counter() - start)


def staircase_bound(terms: RegionTerms, stages: int, replicas: int, upper_bound_s: float, *, axis: str = "pp",
                    time_limit_s: float = 30.0, target_gap: float = 0.002, min_width_s: float = 1e-3,
                    pieces_at_start: int = 8, pp_low_s: float = 0.0) -> Staircase:
    """OPT >= the returned bound (see the module docstring); `upper_bound_s`: a known plan's total.
    axis "pp": pieces of PP, DP bounded by `solve_dp_milp`; axis "dp": pieces of DP, PP bounded by
    `solve_mean_pp_milp` (the mean replica, and at least `milp.pp_floor`). pp_low_s: only plans with
    PP >= pp_low_s are bounded (the others are left to the caller: `path_stairs` splits plans so)."""
    start = time.perf_counter()
    floor = dp_floor(terms, replicas, stages)
    low = max(pp_floor(terms, stages, replicas), float(pp_low_s))
    if stages < 2 or upper_bound_s <= low + floor:
        value = min(upper_bound_s, low + floor)
        return Staircase(value, ((low, low, value),), 0, True, time.perf_counter() - start)

    # A piece [a, b) only needs plans whose other term is < U - a (the rest cost >= U), so each MILP
    # carries that cap; min(its bound, U - a) <= the least other term over all plans of the piece.
    # The small cut-flow relaxation first (a third of the piece's time); the layered graph only when
    # it did not already prove the piece.
    def dp_below(a: float, cap: float, lower: float, left: float) -> tuple[float, bool]:
        started = time.perf_counter()
        dp_cap = upper_bound_s - a
        quick = solve_dp_flow_milp(terms, stages, replicas, cap, left / 3.0, dp_cap_s=dp_cap)
        value = max(lower, min(quick.bound, dp_cap))
        if value >= dp_cap or quick.status == "infeasible":
            return max(lower, dp_cap), True
        result = solve_dp_milp(terms, stages, replicas, cap, max(0.05, left - (time.perf_counter() - started)),
                               dp_cap_s=dp_cap)
        if result is None:
            return value, False
        return max(value, min(result.bound, dp_cap)), result.status != "time_limit"

    def pp_below(a: float, cap: float, lower: float, left: float) -> tuple[float, bool]:
        result = solve_mean_pp_milp(terms, stages, replicas, cap, left, pp_cap_s=upper_bound_s - a)
        return max(lower, min(result.bound, upper_bound_s - a)), result.status != "time_limit"

    if axis == "pp":
        return _stairs(low, upper_bound_s - floor, upper_bound_s, dp_below, floor, time_limit_s, target_gap,
                       min_width_s, pieces_at_start)
    if axis == "dp":
        return _stairs(floor, upper_bound_s - low, upper_bound_s, pp_below, low, time_limit_s, target_gap,
                       min_width_s, pieces_at_start)
    raise ValueError(f"staircase axis must be 'pp' or 'dp', got {axis!r}")


def _cut_flow_model(terms: RegionTerms, stages: int, replicas: int, dp_cap_s: float, pp_cap_s: float):
    """Counts x, presence y, the DP rows with DP <= dp_cap_s, and continuous flows n[s, g, h] between
    consecutive stages; the mean replica's seconds sum pp[g, h] n / R <= pp_cap_s, and no flow on a
    cut that every path of cost <= pp_cap_s avoids. Returns rows, mean-seconds coefficients, the DP
    column, integrality and upper bounds."""
    G = terms.n_regions
    cuts = stages - 1
    f0 = 2 * stages * G
    dp_col = f0 + cuts * G * G
    n_vars = dp_col + 1
    flow = lambda s, g, h: f0 + (s * G + g) * G + h  # noqa: E731
    rows = _Rows()
    _group_rows(rows, terms, stages, replicas, dp_col, dp_cap_s)  # x >= least_presence y
    _flow_conservation_rows(rows, cuts, G, flow)
    mean = np.zeros(n_vars)
    mean[f0:dp_col] = np.tile(terms.pp_s.ravel(), cuts) / replicas
    flow_upper = np.full((cuts, G, G), float(replicas))
    if np.isfinite(pp_cap_s):
        rows.add({int(k): float(mean[k]) for k in np.flatnonzero(mean)}, -np.inf, float(pp_cap_s))
        into, out = cheapest_into_out(terms, stages)
        for s in range(cuts):
            cheapest = into[s][:, None] + terms.pp_s + out[s + 1][None, :]
            flow_upper[s][cheapest > pp_cap_s * (1 + 1e-9) + 1e-12] = 0.0
    integrality = np.zeros(n_vars)
    integrality[:f0] = 1
    upper = np.concatenate([np.minimum(np.repeat(terms.sizes[None, :], stages, 0).ravel(), replicas),
                            np.ones(stages * G), flow_upper.ravel(), [dp_cap_s]]).astype(float)
    return rows, mean, dp_col, integrality, upper


def solve_dp_flow_milp(terms: RegionTerms, stages: int, replicas: int, cap_s: float,
                       time_limit_s: float | None = None, *, dp_cap_s: float = np.inf) -> MilpResult:
    """A small relaxation of `solve_dp_milp` (no path seconds carried, `_cut_flow_model`): a lower
    bound on DP over plans with every replica (hence the mean) <= cap_s and DP <= dp_cap_s; status
    "infeasible", bound inf: there is no such plan."""
    rows, _, dp_col, integrality, upper = _cut_flow_model(terms, stages, replicas, dp_cap_s, cap_s)
    c = np.zeros(dp_col + 1)
    c[dp_col] = 1.0
    return _solve_for_counts(c, rows, integrality, upper, dp_col + 1, time_limit_s, stages, terms.n_regions)


def solve_mean_pp_milp(terms: RegionTerms, stages: int, replicas: int, dp_cap_s: float,
                       time_limit_s: float | None = None, *, pp_cap_s: float = np.inf) -> MilpResult:
    """Lower bound on the least mean replica pipeline seconds (<= PP) of a plan with DP <= dp_cap_s:
    integer counts x, presence y with x >= least_presence * y, the DP rows with DP <= dp_cap_s, and
    continuous flows n[s, g, h] between consecutive stages; minimise sum pp[g, h] n / R. Plans with a
    replica above pp_cap_s are left out (status "infeasible", bound inf: no plan is left)."""
    rows, mean, _, integrality, upper = _cut_flow_model(terms, stages, replicas, dp_cap_s, pp_cap_s)
    result, seconds = _solve(mean, rows, integrality, upper, mean.size, time_limit_s)
    status = _status(result)
    return MilpResult(status, float(result.fun) if result.x is not None else None,
                      _bound(result) if status != "infeasible" else np.inf, None, None, seconds, mean.size)
