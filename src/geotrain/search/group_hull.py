"""DP rows of the region MILPs as a disjunction over presence patterns (a convex-hull formulation).

A stage's DP group with region counts x (sum R) costs dp(x) = max over present regions g of
f_g(x) (see `regions`). The big-M rows of `milp._group_rows` switch each f_g on with a presence
binary; their LP relaxation lets a fraction of a region sit in a stage at almost no dp cost, so the
bound of every model built on them is weak where groups may mix regions. Regions are few (2^G - 1
presence patterns P, G <= MAX_REGIONS), so the rows here write the stage's group as the disjunction
"exactly the regions of P are present" over every pattern P that can still beat a known plan, in
Balas' extended form: per stage s and pattern P a binary z, counts x_P (x_P[g] in [z, min(|g|, R) z]
for g in P, sum R z) and a cost D_P >= f_g homogenised (sum_h dp[g, h] x_P[h] - dp[g, g] z) for
every g in P, D_P <= dp_cap z; then x[s] = sum_P x_P, sum_P z = 1, y[s, g] = sum_{P contains g} z and
DP >= sum_P D_P. Integer solutions are exactly the plans' groups (with dp <= dp_cap); the LP
relaxation is the convex hull of each pattern's polytope, stage by stage.

A pattern is left out when even its cheapest group costs more than dp_cap (a lower bound per
pattern: every member of g pays f_g with one device of each other present region and the rest of
the group in g's cheapest present regions, `pattern_dp_floor`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geotrain.search.regions import RegionTerms, dp_floor

MAX_REGIONS = 10
"""Above this many regions (2^G patterns per stage) the models keep the big-M rows."""


@dataclass(frozen=True)
class HullBlock:
    """Columns appended by `add_hull_group_rows`: how many, their integrality and upper bounds, and
    the presence patterns (K, G) kept."""

    n_cols: int
    integrality: np.ndarray
    upper: np.ndarray
    patterns: np.ndarray | None

    def extend(self, c: np.ndarray, integrality: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """A model's objective, integrality and upper bounds with these columns appended (zero cost),
        and the new column count."""
        c = np.concatenate([c, np.zeros(self.n_cols)])
        return c, np.concatenate([integrality, self.integrality]), np.concatenate([upper, self.upper]), c.size


NO_COLUMNS = HullBlock(0, np.zeros(0), np.zeros(0), None)


def pattern_dp_floor(terms: RegionTerms, replicas: int, patterns: np.ndarray) -> np.ndarray:
    """A lower bound (seconds) on dp(x) over groups of R devices whose present regions are exactly
    each pattern (K, G) bool; inf where no such group fits the region sizes."""
    caps = np.minimum(terms.sizes, replicas)
    out = np.zeros(len(patterns))
    for k, present in enumerate(patterns):
        members = np.flatnonzero(present)
        if members.size > replicas or int(caps[members].sum()) < replicas:
            out[k] = np.inf
            continue
        best = 0.0
        for g in members:
            # f_g = sum_h dp[g, h] x[h] - dp[g, g]: one device of each present region, the rest cheapest first
            spare = replicas - members.size
            order = members[np.argsort(terms.dp_s[g, members], kind="stable")]
            room = caps[order] - 1
            taken = np.minimum(np.cumsum(room), spare)
            extra = np.diff(np.concatenate([[0], taken]))
            value = float(terms.dp_s[g, members].sum() + extra @ terms.dp_s[g, order] - terms.dp_s[g, g])
            best = max(best, value)
        out[k] = best
    return out


def presence_patterns(terms: RegionTerms, replicas: int, dp_cap_s: float) -> np.ndarray:
    """Every presence pattern (K, G) bool whose `pattern_dp_floor` is <= dp_cap_s."""
    G = terms.n_regions
    codes = np.arange(1, 2 ** G)
    patterns = ((codes[:, None] >> np.arange(G)[None, :]) & 1).astype(bool)
    floors = pattern_dp_floor(terms, replicas, patterns)
    slack = 1e-9 * max(1.0, abs(dp_cap_s)) if np.isfinite(dp_cap_s) else 0.0
    return patterns[floors <= dp_cap_s + slack]


def add_hull_group_rows(rows, terms: RegionTerms, stages: int, replicas: int, dp_col: int, first_col: int,
                        dp_cap_s: float = np.inf) -> HullBlock:
    """The group rows of `milp._group_rows` (x[s, g] at s*G+g, y[s, g] at S*G + s*G+g, DP at dp_col)
    written as the pattern disjunction of the module docstring, new columns from first_col on."""
    G = terms.n_regions
    patterns = presence_patterns(terms, replicas, dp_cap_s)
    caps = np.minimum(terms.sizes, replicas).astype(float)
    rows.add({dp_col: 1.0}, dp_floor(terms, replicas, stages), np.inf)
    for s in range(stages):
        rows.add({s * G + g: 1.0 for g in range(G)}, replicas, replicas)
    for g in range(G):
        rows.add({s * G + g: 1.0 for s in range(stages)}, -np.inf, float(terms.sizes[g]))
    col = first_col
    integrality, upper = [], []
    for s in range(stages):
        stage_dp = {dp_col: 1.0}
        choose = {}
        link_x = {g: {s * G + g: -1.0} for g in range(G)}
        link_y = {g: {stages * G + s * G + g: -1.0} for g in range(G)}
        for present in patterns:
            members = np.flatnonzero(present)
            z, d = col, col + 1
            x = {int(g): col + 2 + i for i, g in enumerate(members)}
            col += 2 + members.size
            integrality += [1, 0] + [0] * members.size
            upper += [1.0, dp_cap_s if np.isfinite(dp_cap_s) else np.inf] + [float(caps[g]) for g in members]
            choose[z] = 1.0
            stage_dp[d] = -1.0
            rows.add({**{x[g]: 1.0 for g in x}, z: -float(replicas)}, 0.0, 0.0)
            for g in members:
                rows.add({x[g]: 1.0, z: -1.0}, 0.0, np.inf)
                rows.add({x[g]: 1.0, z: -float(caps[g])}, -np.inf, 0.0)
                coefficients = {x[h]: -float(terms.dp_s[g, h]) for h in members}
                coefficients[z] = float(terms.dp_s[g, g])
                coefficients[d] = 1.0
                rows.add(coefficients, 0.0, np.inf)
                link_x[g][x[g]] = 1.0
                link_y[g][z] = 1.0
            if np.isfinite(dp_cap_s):
                rows.add({d: 1.0, z: -float(dp_cap_s)}, -np.inf, 0.0)
        rows.add(choose, 1.0, 1.0)
        rows.add(stage_dp, 0.0, np.inf)
        for g in range(G):
            rows.add(link_x[g], 0.0, 0.0)
            rows.add(link_y[g], 0.0, 0.0)
    return HullBlock(col - first_col, np.array(integrality, dtype=float), np.array(upper, dtype=float), patterns)
