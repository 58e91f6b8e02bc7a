"""`hierarchical`: two-level placement search that uses the shape of the objective
max_s dp_s + max_r pp_r (pairwise cost models).

Level 1 chooses the DP groups (which devices serve each stage); level 2 wires them into pipelines
(`wiring.rewire`: stage order + bottleneck matchings between adjacent groups, which attacks the
slowest replica directly). Each round of a start:
  1. group moves: `local_search.improve` (incremental swap search, sideways) shuffles devices
     between groups and the unused pool;
  2. critical-group repair: the slowest DP group's slowest member is swapped with the device (in
     another group or unused) that most lowers max(dp of both groups), while that lowers the total;
  3. rewiring of the pipelines for the new groups.
Starts: greedy clusters of cheap links cut into DP groups (the "dp-local" shape) or chained into
pipelines (the "pipeline-local" shape), found from the link costs alone, then random permutations. Start k uses
default_rng([seed, k]); same seed, same result unless the time limit cuts the run short.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from geotrain.search.base import PlacementProblem, ProgressCallback, SearchError, SearchResult
from geotrain.search.local_search import improve
from geotrain.search.regions import pairwise_or_fail
from geotrain.search.wiring import rematch_rows, rewire

REL_TOL = 1e-12


@dataclass(frozen=True)
class HierarchicalConfig:
    """starts: initial groupings (the first 2 from `metric_starts` if structured_starts, the rest random);
    rounds: group/wiring rounds per start at most; stall: rounds without improvement that end a
    start; swaps: swap proposals per group-move phase."""

    starts: int = 4
    rounds: int = 12
    stall: int = 3
    swaps: int = 3000
    structured_starts: bool = True
    candidates: int = 8

    def __post_init__(self) -> None:
        for key in ("starts", "rounds", "stall", "swaps"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "swaps" else 1):
                raise SearchError(f"hierarchical: {key} must be an integer >= {0 if key == 'swaps' else 1}, got {value!r}")
        if not isinstance(self.structured_starts, bool):
            raise SearchError(f"hierarchical: structured_starts must be true or false, got {self.structured_starts!r}")


def _greedy_clusters(pair: np.ndarray, count: int, size: int, chain: bool) -> np.ndarray:
    """`count` disjoint clusters of `size` devices, greedily: seed each at the free device whose
    size-1 cheapest free pairs cost least, then grow by the free device nearest to the last added
    one (chain=True: a pipeline path) or with the least summed cost to the cluster (a DP group)."""
    n = pair.shape[0]
    free = np.ones(n, dtype=bool)
    clusters = np.empty((count, size), dtype=np.int64)
    masked = pair + np.diag(np.full(n, np.inf))
    for c in range(count):
        idx = np.flatnonzero(free)
        sub = masked[np.ix_(idx, idx)]
        k = min(size - 1, idx.size - 1)
        spread = np.partition(sub, k - 1, axis=1)[:, :k].sum(axis=1) if k > 0 else np.zeros(idx.size)
        seed = int(idx[np.argmin(spread)])
        members = [seed]
        free[seed] = False
        score = masked[seed].copy()
        while len(members) < size:
            nxt = int(np.argmin(np.where(free, score, np.inf)))
            members.append(nxt)
            free[nxt] = False
            score = masked[nxt].copy() if chain else score + masked[nxt]
        clusters[c] = members
    return clusters


def metric_starts(dp_pair: np.ndarray, pp_pair: np.ndarray, stages: int, replicas: int) -> list[np.ndarray]:
    """Two structured starts from the link costs alone: DP groups of mutually cheap devices
    (the "dp-local" shape) and pipelines of chained cheap links (the "pipeline-local" shape)."""
    groups = _greedy_clusters(dp_pair, stages, replicas, chain=False)
    pipelines = _greedy_clusters(pp_pair, replicas, stages, chain=True).T.copy()
    return [groups, pipelines]


def _totals(dp_pair: np.ndarray, pp_pair: np.ndarray, assignment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row sums (S, R): each member's all-reduce seconds, chain seconds (R,))."""
    rows = dp_pair[assignment[:, :, None], assignment[:, None, :]].sum(axis=-1)
    chains = pp_pair[assignment[:-1], assignment[1:]].sum(axis=0) if assignment.shape[0] > 1 else np.zeros(assignment.shape[1])
    return rows, chains


def total_seconds(dp_pair: np.ndarray, pp_pair: np.ndarray, assignment: np.ndarray) -> float:
    rows, chains = _totals(dp_pair, pp_pair, assignment)
    return float(rows.max() + chains.max())


def plan_key(dp_pair: np.ndarray, pp_pair: np.ndarray, assignment: np.ndarray) -> tuple[float, float]:
    """(total, sum of every group's dp and every replica's pp): the sum orders plans of equal total,
    so that fixing one of several equally slow replicas (or groups) counts as progress."""
    rows, chains = _totals(dp_pair, pp_pair, assignment)
    stage_dp = rows.max(axis=1)
    return float(stage_dp.max() + chains.max()), float(stage_dp.sum() + chains.sum())


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """a < b lexicographically, with a relative tolerance on the total."""
    if a[0] < b[0] * (1 - REL_TOL):
        return True
    return a[0] <= b[0] * (1 + REL_TOL) and a[1] < b[1] * (1 - REL_TOL)


def repair_critical_group(dp_pair: np.ndarray, pp_pair: np.ndarray, assignment: np.ndarray, n_devices: int,
                          max_moves: int) -> np.ndarray:
    """Swap the slowest member of the slowest DP group with the device that most lowers the larger
    of the two groups' dp (vectorised over all candidates), re-wire, keep it if the total drops."""
    assignment = assignment.copy()
    S, R = assignment.shape
    if R < 2:  # one replica: every DP group is a single device, dp = 0, nothing to repair
        return assignment
    current = total_seconds(dp_pair, pp_pair, assignment)
    unused = np.setdiff1d(np.arange(n_devices), assignment.ravel())
    for _ in range(max_moves):
        rows, _ = _totals(dp_pair, pp_pair, assignment)
        stage_dp = rows.max(axis=1)
        s = int(np.argmax(stage_dp))
        r = int(np.argmax(rows[s]))
        u = assignment[s, r]
        others = np.delete(assignment[s], r)
        rest_dp = np.delete(stage_dp, s).max(initial=0.0)
        # new dp of group s when u is replaced by candidate v (every device at once)
        shifted = rows[s, np.arange(R) != r][:, None] - dp_pair[others, u][:, None] + dp_pair[others, :]
        new_s = np.maximum(shifted.max(axis=0), dp_pair[:, others].sum(axis=1))
        best_move, best_dp = None, stage_dp[s]
        for t in range(S):
            if t == s:
                continue
            members = assignment[t]
            group_rows = rows[t]
            for q in range(R):
                v = members[q]
                mates = np.delete(members, q)
                new_t = max((np.delete(group_rows, q) - dp_pair[mates, v] + dp_pair[mates, u]).max(initial=0.0),
                            dp_pair[u, mates].sum())
                score = max(new_s[v], new_t, np.delete(stage_dp, [s, t]).max(initial=0.0))
                if score < best_dp * (1 - REL_TOL):
                    best_move, best_dp = (t, q), score
        for v in unused:
            score = max(new_s[v], rest_dp)
            if score < best_dp * (1 - REL_TOL):
                best_move, best_dp = (-1, int(v)), score
        if best_move is None:
            break
        candidate = assignment.copy()
        t, q = best_move
        if t >= 0:
            candidate[s, r], candidate[t, q] = candidate[t, q], candidate[s, r]
        else:
            candidate[s, r] = q
        candidate = rewire(pp_pair, candidate)
        total = total_seconds(dp_pair, pp_pair, candidate)
        if total >= current * (1 - REL_TOL):
            break
        assignment, current = candidate, total
        unused = np.setdiff1d(np.arange(n_devices), assignment.ravel())
    return assignment


def _swap(assignment: np.ndarray, u: tuple[int, int], v: tuple[int, int] | int) -> np.ndarray:
    """Swap slot u with slot v, or put unused device v into slot u."""
    out = assignment.copy()
    if isinstance(v, tuple):
        out[u], out[v] = out[v], out[u]
    else:
        out[u] = v
    return out


def repair_critical_replica(dp_pair: np.ndarray, pp_pair: np.ndarray, assignment: np.ndarray, n_devices: int,
                            candidates: int, max_moves: int) -> np.ndarray:
    """Move devices on the slowest replica to other DP groups (or out), and bring in devices that
    are close to its chain neighbours; each candidate is scored after re-matching the cuts next to
    the two groups touched, and the best one is kept while plan_key drops."""
    S, R = assignment.shape
    current = plan_key(dp_pair, pp_pair, assignment)
    for _ in range(max_moves):
        chains = pp_pair[assignment[:-1], assignment[1:]].sum(axis=0)
        r = int(np.argmax(chains))
        slot_of = {int(d): (s, q) for (s, q), d in np.ndenumerate(assignment)}
        best, best_key = None, current
        for s in range(S):
            neighbours = [assignment[t, r] for t in (s - 1, s + 1) if 0 <= t < S]
            closeness = pp_pair[neighbours].sum(axis=0)
            closeness[assignment[s]] = np.inf  # same group: the matching already covers those
            for v in np.argsort(closeness, kind="stable")[:candidates]:
                target = slot_of.get(int(v), int(v))
                moved = _swap(assignment, (s, r), target)
                rows = {s} | ({target[0]} if isinstance(target, tuple) else set())
                moved = rematch_rows(pp_pair, moved, rows)
                key = plan_key(dp_pair, pp_pair, moved)
                if _better(key, best_key):
                    best, best_key = moved, key
        if best is None:
            break
        assignment, current = best, best_key
    return assignment


def hierarchical_search(
    problem: PlacementProblem,
    config: HierarchicalConfig,
    *,
    seed: int,
    time_limit_s: float | None = None,
    progress: ProgressCallback | None = None,
    initial: np.ndarray | None = None,
) -> SearchResult:
    """Best plan over `config.starts` starts of the group/wiring rounds (see the module docstring);
    `initial`: an (S, R) plan used as the first start (`auto` restarts from its best so far, kicked)."""
    start_time = time.perf_counter()
    model = problem.cost_model
    terms = pairwise_or_fail(model, "hierarchical")
    dp_pair, pp_pair = np.ascontiguousarray(terms.dp_pair_s), np.ascontiguousarray(terms.pp_pair_s)
    S, R, N = problem.stages, problem.replicas, problem.n_devices
    structured = ([np.asarray(initial, dtype=np.int64)] if initial is not None else []) + \
        (metric_starts(dp_pair, pp_pair, S, R) if config.structured_starts else [])
    runs: list[dict] = []
    best: tuple[float, np.ndarray] | None = None
    evaluations = 0
    timed_out = False
    out_of_time = lambda: time_limit_s is not None and time.perf_counter() - start_time > time_limit_s  # noqa: E731
    for k in range(config.starts):
        rng = np.random.default_rng([seed, k])
        assignment = structured[k] if k < len(structured) else rng.permutation(N)[: S * R].reshape(S, R)
        assignment = rewire(pp_pair, assignment)
        current = plan_key(dp_pair, pp_pair, assignment)
        first, stall, rounds = current[0], 0, 0
        while rounds < config.rounds and stall < config.stall and not timed_out:
            rounds += 1
            moved = improve(model, assignment, config.swaps, rng=rng).assignment if config.swaps else assignment
            evaluations += config.swaps
            moved = rewire(pp_pair, moved)
            # at 1000+ devices one phase takes seconds: the later ones are skipped once time is up
            if not out_of_time():
                moved = repair_critical_group(dp_pair, pp_pair, moved, N, max_moves=R)
            if not out_of_time():
                moved = rewire(pp_pair, repair_critical_replica(dp_pair, pp_pair, moved, N, config.candidates,
                                                                max_moves=2 * S))
            key = plan_key(dp_pair, pp_pair, moved)
            if _better(key, current):
                assignment, current, stall = moved, key, 0
            else:
                stall += 1
            if progress is not None:
                progress(k * config.rounds + rounds, config.starts * config.rounds)
            timed_out = out_of_time()
        runs.append({"start_total": first, "total": current[0], "rounds": rounds})
        if best is None or current[0] < best[0] * (1 - REL_TOL):
            best = (current[0], assignment)
        if timed_out:
            break
    assert best is not None
    return SearchResult(
        method="hierarchical",
        assignment=best[1],
        cost=model.evaluate(best[1]),
        seconds=time.perf_counter() - start_time,
        evaluations=evaluations,
        details={"per_start_totals": [run["total"] for run in runs], "starts": runs, "timed_out": timed_out},
    )
