"""Region-level view of a pairwise cost model: what the exact MILP and the lower bounds work on.

When every device pair's cost depends only on the two devices' regions (`Cluster.is_region_uniform`),
the G x G region matrices below describe the model exactly. Otherwise they hold the *cheapest*
device pair of each region pair, so every cost computed from them is a lower bound of the true one
(dp_s and pp_r only grow with the pair costs).

For a DP group with x[g] devices of region g, a member of region g needs
    f_g(x) = (x[g] - 1) dp[g, g] + sum_{h != g} x[h] dp[g, h]     seconds,
and a replica whose stages lie in regions p_0 .. p_{S-1} needs sum_s pp[p_s, p_s+1] seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost import CostModel
from geotrain.search.base import SearchError


@dataclass(frozen=True)
class RegionTerms:
    """sizes: devices per region (G,); dp_s, pp_s: G x G per-pair seconds (diagonal = inside a
    region; 0 for a one-device region); exact: True when the cluster is region-uniform."""

    sizes: np.ndarray
    dp_s: np.ndarray
    pp_s: np.ndarray
    exact: bool

    @property
    def n_regions(self) -> int:
        return int(self.sizes.size)

    def group_member_seconds(self, counts: np.ndarray) -> np.ndarray:
        """f_g(x) for every region g, for a group with region counts `counts` (..., G)."""
        return counts @ self.dp_s.T - np.diag(self.dp_s)

    def group_seconds(self, counts: np.ndarray) -> np.ndarray:
        """dp of groups with region counts (..., G): the max of f_g over regions present."""
        counts = np.asarray(counts)
        member = self.group_member_seconds(counts)
        return np.where(counts > 0, member, -np.inf).max(axis=-1).clip(min=0.0)

    def path_seconds(self, paths: np.ndarray) -> np.ndarray:
        """Pipeline seconds of region paths (..., S)."""
        paths = np.asarray(paths, dtype=np.int64)
        if paths.shape[-1] < 2:
            return np.zeros(paths.shape[:-1])
        return self.pp_s[paths[..., :-1], paths[..., 1:]].sum(axis=-1)

    def assignment_seconds(self, region_assignment: np.ndarray) -> float:
        """Total (dp + pp) of an (S, R) array of region indices under these region terms."""
        region_assignment = np.asarray(region_assignment, dtype=np.int64)
        counts = np.stack([np.bincount(row, minlength=self.n_regions) for row in region_assignment])
        return float(self.group_seconds(counts).max() + self.path_seconds(region_assignment.T).max())


def pairwise_or_fail(model: CostModel, method: str):
    """The model's PairwiseTerms, or a SearchError saying `method` needs a pairwise model."""
    terms = model.pairwise_terms()
    if terms is None:
        raise SearchError(f"{method} needs a pairwise cost model (like 'yuan'); {model.name!r} is not pairwise")
    return terms


def region_terms(cluster: Cluster, model: CostModel, method: str = "region model") -> RegionTerms:
    """Aggregate the model's pairwise terms by region: exact if region-uniform, else the cheapest pair."""
    terms = pairwise_or_fail(model, method)
    G = cluster.n_regions
    members = [cluster.devices_in_region(g) for g in range(G)]
    sizes = np.array([m.size for m in members], dtype=np.int64)
    out = []
    for pair in (terms.dp_pair_s, terms.pp_pair_s):
        matrix = np.zeros((G, G))
        for g in range(G):
            for h in range(G):
                block = pair[np.ix_(members[g], members[h])]
                if g == h:
                    if members[g].size < 2:
                        continue
                    block = block[~np.eye(members[g].size, dtype=bool)]
                if block.size:
                    matrix[g, h] = block.min()
        out.append(matrix)
    exact = True
    for pair, matrix in zip((terms.dp_pair_s, terms.pp_pair_s), out):
        expanded = matrix[np.ix_(cluster.region_of, cluster.region_of)]
        off = ~np.eye(cluster.n_devices, dtype=bool)
        if not np.allclose(pair[off], expanded[off], rtol=1e-12, atol=0.0):
            exact = False
    return RegionTerms(sizes=sizes, dp_s=out[0], pp_s=out[1], exact=exact)


def dp_floor(terms: RegionTerms, replicas: int, stages: int | None = None) -> float:
    """A lower bound on every plan's dp. Each member of a DP group pays at least the sum of its R - 1
    cheapest pairs: for a device of region g, sizes[g] - 1 pairs at dp[g, g] and sizes[h] at dp[g, h].
    With `stages`, the S R used devices include one whose sum is at least the (S R)-th smallest over
    all devices (the combinatorial bound of `bounds`, per region); without, the cheapest device's."""
    if replicas < 2:
        return 0.0
    per_region = np.empty(terms.n_regions)
    for g in range(terms.n_regions):
        counts = terms.sizes.astype(float).copy()
        counts[g] -= 1
        order = np.argsort(terms.dp_s[g], kind="stable")
        taken = np.minimum(np.cumsum(counts[order]), replicas - 1)
        per_region[g] = float(np.diff(np.concatenate([[0.0], taken])) @ terms.dp_s[g, order])
    if stages is None:
        return float(per_region.min())
    order = np.argsort(per_region, kind="stable")
    position = np.searchsorted(np.cumsum(terms.sizes[order]), stages * replicas)  # region of the (S R)-th device
    return float(per_region[order[min(position, len(order) - 1)]])


def least_presence(terms: RegionTerms, replicas: int, dp_cap_s: float) -> np.ndarray:
    """m[g]: the fewest devices of region g a DP group with dp <= dp_cap_s can hold, if it holds any.
    A member of g pays f_g(x) = (R - 1) dp[g, g] + sum_{h != g} (dp[g, h] - dp[g, g]) x[h] >=
    (R - 1) dp[g, g] + step_g (R - x[g]), step_g the cheapest such difference (0 if none is positive)."""
    G = terms.n_regions
    diagonal = np.diag(terms.dp_s)
    step = np.where(np.eye(G, dtype=bool), np.inf, terms.dp_s - diagonal[:, None]).min(axis=1)
    m = np.ones(G)
    ok = step > 0
    m[ok] = np.ceil(replicas - (dp_cap_s - (replicas - 1) * diagonal[ok]) / step[ok] - 1e-9)
    return np.clip(m, 1.0, float(replicas))


def _suffix_seconds(terms: RegionTerms, stages: int) -> np.ndarray:
    """suffix[k, g]: the cheapest k-cut region path starting in region g."""
    suffix = np.zeros((max(stages, 1), terms.n_regions))
    for k in range(1, stages):
        suffix[k] = (terms.pp_s + suffix[k - 1][None, :]).min(axis=1)
    return suffix


def cheapest_path_seconds(terms: RegionTerms, stages: int) -> float:
    """The pipeline seconds of the cheapest region path (capacities ignored)."""
    return float(_suffix_seconds(terms, stages)[max(stages, 1) - 1].min())


def enumerate_paths(terms: RegionTerms, stages: int, cap_s: float, max_paths: int) -> tuple[np.ndarray, np.ndarray] | None:
    """All region paths (P, S) with pipeline seconds <= cap_s, and their seconds (P,), cheapest first.
    None when there are more than `max_paths` of them."""
    G, pp = terms.n_regions, terms.pp_s
    suffix = _suffix_seconds(terms, stages)
    slack = 1e-9 * max(1.0, abs(cap_s))
    paths = np.arange(G, dtype=np.int64)[:, None]
    cost = np.zeros(G)
    keep = suffix[stages - 1] <= cap_s + slack
    paths, cost = paths[keep], cost[keep]
    for s in range(1, stages):
        last = paths[:, -1]
        grown_cost = (cost[:, None] + pp[last]).ravel()
        remaining = np.tile(suffix[stages - 1 - s], len(paths))
        keep = grown_cost + remaining <= cap_s + slack
        if int(keep.sum()) > max_paths:
            return None
        index = np.flatnonzero(keep)
        paths = np.concatenate([paths[index // G], (index % G)[:, None]], axis=1)
        cost = grown_cost[index]
    if len(paths) > max_paths:
        return None
    order = np.argsort(cost, kind="stable")
    return paths[order], cost[order]


def expand_to_devices(cluster: Cluster, stage_paths: np.ndarray) -> np.ndarray:
    """An (S, R) device assignment whose replica r follows region path stage_paths[:, r], taking the
    lowest-index free device of each region. Raises SearchError if a region runs out of devices."""
    stage_paths = np.asarray(stage_paths, dtype=np.int64)
    free = {g: list(cluster.devices_in_region(g)) for g in range(cluster.n_regions)}
    out = np.empty_like(stage_paths)
    for s in range(stage_paths.shape[0]):
        for r in range(stage_paths.shape[1]):
            g = int(stage_paths[s, r])
            if not free[g]:
                raise SearchError(f"region {cluster.region_names[g]!r} has too few devices for this plan")
            out[s, r] = free[g].pop(0)
    return out
