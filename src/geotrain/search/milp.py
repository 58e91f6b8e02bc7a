"""Mixed-integer programs over region counts (scipy.optimize.milp, i.e. HiGHS) for `exact` and the bounds.

Path model (exact when the region terms are): integer x[s, g] = devices of region g in stage s,
binary y[s, g] = "region g present in stage s", integer n[p] = replicas following region path p,
binary u[p] = "path p used", continuous DP, PP:
    sum_g x[s, g] = R;  sum_s x[s, g] <= |g|;  y <= x <= R y;  x[s, g] = sum_{p: p_s = g} n[p]
    DP >= f_g(x[s]) - M (1 - y[s, g])      (f_g: see `regions`; M = R max_h dp[g, h] >= f_g(x))
    n[p] <= R u[p];  PP >= cost(p) u[p];  PP >= sum_p cost(p) n[p] / R   (max >= mean: a valid cut)
    minimise DP + PP.
Flow model (a relaxation for bounds when there are too many paths): n[p] is replaced by integer
flows n[s, g, h] between consecutive stages with binaries z[s, g, h], and a used cut g -> h at s
forces PP >= (cheapest path into g at s) + pp[g, h] + (cheapest path out of h at s + 1).
With a DP cap (`_group_rows`: plans above it need not be represented), DP <= cap and a present
region holds at least `regions.least_presence` devices. The models go to HiGHS through
`highs.solve_milp`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import LinearConstraint
from scipy.sparse import coo_matrix

from geotrain.search.highs import solve_milp
from geotrain.search.regions import RegionTerms, cheapest_path_seconds, dp_floor, least_presence

BOUND_SAFETY = 1e-7
"""Relative amount taken off MILP dual bounds so that solver tolerances never make a bound invalid."""


@dataclass(frozen=True)
class MilpResult:
    """status: "optimal", "time_limit" or "infeasible"; objective: best solution's value (s) or None;
    bound: proven lower bound on the model's optimum (s), deflated by BOUND_SAFETY; counts: (S, G)
    region counts per stage; stage_paths: (S, R) region of every slot (path model only)."""

    status: str
    objective: float | None
    bound: float
    counts: np.ndarray | None
    stage_paths: np.ndarray | None
    seconds: float
    variables: int


class _Rows:
    """Sparse constraint rows: add(coefficients {column: value}, lower, upper)."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []

    def add(self, coefficients: dict[int, float], lower: float, upper: float) -> None:
        row = len(self.lower)
        for col, value in coefficients.items():
            self.rows.append(row)
            self.cols.append(col)
            self.vals.append(value)
        self.lower.append(lower)
        self.upper.append(upper)

    def constraint(self, n_vars: int) -> LinearConstraint:
        matrix = coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.lower), n_vars)).tocsr()
        return LinearConstraint(matrix, np.array(self.lower), np.array(self.upper))


def _group_rows(rows: _Rows, terms: RegionTerms, stages: int, replicas: int, dp_col: int,
                dp_cap_s: float = np.inf) -> None:
    """The DP group rows on x (cols s*G+g), y (cols S*G + s*G+g) and DP (dp_col): big-M rows
    (`_big_m_group_rows`). dp_cap_s: plans with a larger DP need not be represented, so DP <= dp_cap_s
    and a present region holds at least `least_presence` devices."""
    _big_m_group_rows(rows, terms, stages, replicas, dp_col)
    if np.isfinite(dp_cap_s):
        rows.add({dp_col: 1.0}, -np.inf, float(dp_cap_s))
        G = terms.n_regions
        m = least_presence(terms, replicas, dp_cap_s)
        for s in range(stages):
            for g in range(G):
                if m[g] > 1:
                    rows.add({s * G + g: 1.0, stages * G + s * G + g: -float(m[g])}, 0.0, np.inf)


def _big_m_group_rows(rows: _Rows, terms: RegionTerms, stages: int, replicas: int, dp_col: int) -> None:
    """Stage sizes, region capacities, presence indicators and DP >= f_g constraints on x (cols
    s*G+g) and y (cols S*G + s*G+g)."""
    G = terms.n_regions
    x = lambda s, g: s * G + g  # noqa: E731
    y = lambda s, g: stages * G + s * G + g  # noqa: E731
    # A valid cut: every plan's dp is at least the combinatorial floor; it lifts the LP relaxation,
    # which the big-M rows below leave near 0.
    rows.add({dp_col: 1.0}, dp_floor(terms, replicas, stages), np.inf)
    for s in range(stages):
        rows.add({x(s, g): 1.0 for g in range(G)}, replicas, replicas)
    for g in range(G):
        rows.add({x(s, g): 1.0 for s in range(stages)}, -np.inf, float(terms.sizes[g]))
    for s in range(stages):
        for g in range(G):
            rows.add({x(s, g): 1.0, y(s, g): -float(replicas)}, -np.inf, 0.0)
            rows.add({y(s, g): 1.0, x(s, g): -1.0}, -np.inf, 0.0)
            big = replicas * float(terms.dp_s[g].max())  # f_g <= R max_h dp[g, h], g present or not
            coefficients = {x(s, h): -float(terms.dp_s[g, h]) for h in range(G)}
            coefficients[dp_col] = 1.0
            coefficients[y(s, g)] = -big
            rows.add(coefficients, -float(terms.dp_s[g, g]) - big, np.inf)


def _flow_conservation_rows(rows: _Rows, cuts: int, groups: int, flow) -> None:
    """Replica flows between region groups across every cut: what leaves group g of stage s (flows
    g -> h over cut s) equals stage s's count of g, what arrives at g of stage s + 1 equals its count
    (count columns s * groups + g)."""
    for s in range(cuts):
        for g in range(groups):
            coefficients = {flow(s, g, h): 1.0 for h in range(groups)}
            coefficients[s * groups + g] = -1.0
            rows.add(coefficients, 0.0, 0.0)
            coefficients = {flow(s, h, g): 1.0 for h in range(groups)}
            coefficients[(s + 1) * groups + g] = -1.0
            rows.add(coefficients, 0.0, 0.0)


def _solve(c, rows, integrality, upper, n_vars, time_limit_s, initial=None) -> tuple[object, float]:
    start = time.perf_counter()
    constraint = rows.constraint(n_vars)
    result = solve_milp(c, constraint.A, constraint.lb, constraint.ub, integrality, upper, time_limit_s, initial)
    return result, time.perf_counter() - start


def _solve_for_counts(c, rows, integrality, upper, n_vars: int, time_limit_s: float | None, stages: int,
                      groups: int) -> MilpResult:
    """Solve a model whose first stages x groups columns are the device counts per (stage, group)."""
    result, seconds = _solve(c, rows, integrality, upper, n_vars, time_limit_s)
    status = _status(result)
    counts = None
    if result.x is not None and status != "infeasible":
        counts = np.rint(result.x[: stages * groups]).astype(np.int64).reshape(stages, groups)
    return MilpResult(status, float(result.fun) if result.x is not None else None,
                      _bound(result) if status != "infeasible" else np.inf, counts, None, seconds, n_vars)


def _status(result) -> str:
    if result.status == 0:
        return "optimal"
    if result.status == 2:
        return "infeasible"
    return "time_limit"


def _bound(result) -> float:
    if result.status == 0:
        value = float(result.fun)
    else:
        value = float(getattr(result, "mip_dual_bound", 0.0) or 0.0)
        if not np.isfinite(value):
            value = 0.0
    return max(0.0, value * (1.0 - BOUND_SAFETY))


def path_model_point(terms: RegionTerms, paths: np.ndarray, path_s: np.ndarray, stage_paths: np.ndarray) -> np.ndarray:
    """The path model's variables (column order of `solve_path_milp`) for a plan whose replicas follow
    the region paths stage_paths[:, r] (S, R), each one a row of `paths` (ValueError naming the first
    replica path that is not)."""
    S, R = stage_paths.shape
    G, P = terms.n_regions, len(paths)
    index = {tuple(int(v) for v in path): p for p, path in enumerate(paths)}
    n = np.zeros(P)
    for column in stage_paths.T:
        key = tuple(int(v) for v in column)
        if key not in index:
            raise ValueError(f"path model point: replica path {key} is not among the {P} paths given")
        n[index[key]] += 1
    counts = np.stack([np.bincount(row, minlength=G) for row in stage_paths]).astype(float)
    # the floor row holds for every plan; max() only guards it against rounding
    dp = max(float(terms.group_seconds(counts).max()), dp_floor(terms, R, S))
    pp = float(path_s[n > 0].max()) if P else 0.0
    return np.concatenate([counts.ravel(), (counts > 0).ravel().astype(float), n, (n > 0).astype(float), [dp, pp]])


def solve_path_milp(terms: RegionTerms, stages: int, replicas: int, paths: np.ndarray, path_s: np.ndarray,
                    time_limit_s: float | None = None, initial: np.ndarray | None = None, *,
                    dp_cap_s: float = np.inf) -> MilpResult:
    """The path model over the given region paths (P, S) with their pipeline seconds (P,). `initial`:
    a plan's region paths (S, R), each a row of `paths`, HiGHS's first incumbent (`path_model_point`).
    dp_cap_s: plans with a larger DP are left out (`_group_rows`; status "infeasible": none is left)."""
    G, P = terms.n_regions, len(paths)
    n0, u0 = 2 * stages * G, 2 * stages * G + P
    dp_col, pp_col = u0 + P, u0 + P + 1
    n_vars = pp_col + 1
    rows = _Rows()
    _group_rows(rows, terms, stages, replicas, dp_col, dp_cap_s)
    for s in range(stages):
        for g in range(G):
            coefficients = {s * G + g: 1.0}
            for p in np.flatnonzero(paths[:, s] == g):
                coefficients[n0 + int(p)] = -1.0
            rows.add(coefficients, 0.0, 0.0)
    for p in range(P):
        rows.add({n0 + p: 1.0, u0 + p: -float(replicas)}, -np.inf, 0.0)
        rows.add({pp_col: 1.0, u0 + p: -float(path_s[p])}, 0.0, np.inf)
    mean = {n0 + p: -float(path_s[p]) / replicas for p in range(P)}
    mean[pp_col] = 1.0
    rows.add(mean, 0.0, np.inf)
    c = np.zeros(n_vars)
    c[dp_col] = c[pp_col] = 1.0
    integrality = np.ones(n_vars)
    integrality[[dp_col, pp_col]] = 0
    upper = np.concatenate([np.minimum(np.repeat(terms.sizes[None, :], stages, 0).ravel(), replicas),
                            np.ones(stages * G), np.full(P, replicas), np.ones(P), [np.inf, np.inf]]).astype(float)
    start = None if initial is None else path_model_point(terms, paths, path_s, np.asarray(initial, dtype=np.int64))
    result, seconds = _solve(c, rows, integrality, upper, n_vars, time_limit_s, start)
    status = _status(result)
    counts = stage_paths = None
    objective = None
    if result.x is not None and status != "infeasible":
        objective = float(result.fun)
        counts = np.rint(result.x[: stages * G]).astype(np.int64).reshape(stages, G)
        n = np.rint(result.x[n0:u0]).astype(np.int64)
        columns = [paths[p] for p in np.flatnonzero(n) for _ in range(n[p])]
        stage_paths = np.array(columns, dtype=np.int64).T.reshape(stages, replicas)
    return MilpResult(status, objective, _bound(result) if status != "infeasible" else np.inf, counts, stage_paths,
                      seconds, n_vars)


def cheapest_into_out(terms: RegionTerms, stages: int) -> tuple[np.ndarray, np.ndarray]:
    """into[s, g]: the cheapest region path over stages 0..s ending in g; out[s, g]: over stages
    s..S-1 starting in g (seconds, capacities ignored). A replica crossing g -> h at cut s costs at
    least into[s, g] + pp[g, h] + out[s + 1, h]."""
    G, pp = terms.n_regions, terms.pp_s
    into = np.zeros((stages, G))
    out = np.zeros((stages, G))
    for s in range(1, stages):
        into[s] = (into[s - 1][:, None] + pp).min(axis=0)
    for s in range(stages - 2, -1, -1):
        out[s] = (pp + out[s + 1][None, :]).min(axis=1)
    return into, out


def pp_floor(terms: RegionTerms, stages: int, replicas: int) -> float:
    """A lower bound on every plan's PP (seconds): the cheapest region path, or more when some replica
    must cross regions. A replica that stays in region g holds S of its devices. When a plan uses
    every device (S R = sum of sizes), a region whose size is not a multiple of S therefore holds a
    device of a replica that visits it and crosses to another region, so PP >= that region's
    cheapest crossing path (`crossing_path_seconds`); the largest such value over those regions
    holds. Otherwise, when sum_g floor(size_g / S) < R, some replica crosses: PP >= the cheapest
    crossing path of any region."""
    cheapest = cheapest_path_seconds(terms, stages)
    if stages < 2:
        return cheapest
    crossing = crossing_path_seconds(terms, stages)
    sizes = terms.sizes
    if stages * replicas == int(sizes.sum()):
        forced = sizes % stages != 0
        return max(cheapest, float(crossing[forced].max())) if forced.any() else cheapest
    if int((sizes // stages).sum()) < replicas:
        return max(cheapest, float(crossing.min()))
    return cheapest


def crossing_path_seconds(terms: RegionTerms, stages: int) -> np.ndarray:
    """c[g]: the cheapest region path that visits g and another region (seconds; inf for S < 2). Such a
    path has a run of g next to another region h, so it crosses g -> h or h -> g at some cut s:
    c[g] = min over s, h != g of into[s, g] + pp[g, h] + out[s + 1, h] and the reverse."""
    G = terms.n_regions
    into, out = cheapest_into_out(terms, stages)
    c = np.full(G, np.inf)
    off = ~np.eye(G, dtype=bool)
    for s in range(stages - 1):
        cost = np.where(off, into[s][:, None] + terms.pp_s + out[s + 1][None, :], np.inf)  # [g, h]: g -> h
        c = np.minimum(c, np.minimum(cost.min(axis=1), cost.min(axis=0)))
    return c


def solve_flow_milp(terms: RegionTerms, stages: int, replicas: int, time_limit_s: float | None = None, *,
                    dp_cap_s: float = np.inf) -> MilpResult:
    """The flow relaxation (lower bound only; its solutions need not be realisable); plans with
    DP > dp_cap_s are left out (`_group_rows`)."""
    G = terms.n_regions
    cuts = max(stages - 1, 0)
    f0 = 2 * stages * G
    z0 = f0 + cuts * G * G
    dp_col, pp_col = z0 + cuts * G * G, z0 + cuts * G * G + 1
    n_vars = pp_col + 1
    pp = terms.pp_s
    into, out = cheapest_into_out(terms, stages)
    flow = lambda s, g, h: f0 + (s * G + g) * G + h  # noqa: E731
    rows = _Rows()
    _group_rows(rows, terms, stages, replicas, dp_col, dp_cap_s)
    _flow_conservation_rows(rows, cuts, G, flow)
    for s in range(cuts):
        for g in range(G):
            for h in range(G):
                k = flow(s, g, h)
                rows.add({k: 1.0, k + cuts * G * G: -float(replicas)}, -np.inf, 0.0)
                rows.add({pp_col: 1.0, k + cuts * G * G: -float(into[s, g] + pp[g, h] + out[s + 1, h])}, 0.0, np.inf)
    mean = {flow(s, g, h): -float(pp[g, h]) / replicas for s in range(cuts) for g in range(G) for h in range(G)}
    mean[pp_col] = 1.0
    rows.add(mean, 0.0, np.inf)
    c = np.zeros(n_vars)
    c[dp_col] = c[pp_col] = 1.0
    integrality = np.ones(n_vars)
    integrality[[dp_col, pp_col]] = 0
    upper = np.concatenate([np.minimum(np.repeat(terms.sizes[None, :], stages, 0).ravel(), replicas),
                            np.ones(stages * G), np.full(cuts * G * G, replicas), np.ones(cuts * G * G),
                            [np.inf, np.inf]]).astype(float)
    return _solve_for_counts(c, rows, integrality, upper, n_vars, time_limit_s, stages, G)
