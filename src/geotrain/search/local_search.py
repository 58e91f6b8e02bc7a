"""Local search by random swaps, multi-start (the seed's `local_search`).

Each restart starts from a uniformly random placement and tries `iterations` swaps of two slots
(or of a slot and an unused device when S*R < N). `strict` accepts only swaps that lower the total;
the default ("sideways") also accepts equal totals, which lets the walk cross the wide plateaus of a
max-of-sums objective: most swaps do not touch the slowest stage group or replica.

With a pairwise cost model (`CostModel.pairwise_terms()`), swaps are evaluated incrementally in a
numba kernel (see `incremental`); otherwise, or with `incremental=False`, every swap is a full
`evaluate_many` call of the cost model. Same seed, same result, unless a time limit cuts a run short.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from geotrain.cost import CostModel, PairwiseTerms, as_assignment
from geotrain.search.base import PlacementProblem, ProgressCallback, SearchError, SearchResult
from geotrain.search.incremental import ACCEPT_SIDEWAYS, ACCEPT_STRICT, REL_TOL, draw_swaps, init_state, swap_search

CHUNK = 4096  # swaps drawn and run per kernel call: progress and time-limit checks happen between chunks


@dataclass(frozen=True)
class LocalSearchConfig:
    """iterations: swaps tried per restart; restarts: random starting points (best one wins);
    strict: accept only improvements (default also accepts equal cost); incremental: False forces a
    full cost-model evaluation per swap (slow baseline)."""

    iterations: int = 20000
    restarts: int = 5
    strict: bool = False
    incremental: bool = True

    def __post_init__(self) -> None:
        for key in ("iterations", "restarts"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "iterations" else 1):
                raise SearchError(f"local-search: {key} must be an integer >= {0 if key == 'iterations' else 1}, got {value!r}")
        for key in ("strict", "incremental"):
            if not isinstance(getattr(self, key), bool):
                raise SearchError(f"local-search: {key} must be true or false, got {getattr(self, key)!r}")


class Improvement(NamedTuple):
    """What `improve` returns: the improved (S, R) assignment, its total (s), swaps evaluated."""

    assignment: np.ndarray
    total: float
    evaluations: int


class _Walk:
    """One swap walk over a device order; `run(count)` draws and tries `count` swaps."""

    def __init__(self, model: CostModel, order: np.ndarray, strict: bool, rng: np.random.Generator,
                 incremental: bool = True) -> None:
        self.model = model
        self.stages, self.replicas, self.n_devices = model.stages, model.replicas, model.n_devices
        self.order = np.ascontiguousarray(order, dtype=np.int64)
        self.mode = ACCEPT_STRICT if strict else ACCEPT_SIDEWAYS
        self.rng = rng
        self.accepted = 0
        self.evaluations = 0
        terms: PairwiseTerms | None = model.pairwise_terms() if incremental else None
        self.terms = terms
        if terms is not None:
            self.dp_pair = np.ascontiguousarray(terms.dp_pair_s, dtype=np.float64)
            self.pp_pair = np.ascontiguousarray(terms.pp_pair_s, dtype=np.float64)
            self.state = init_state(self.dp_pair, self.pp_pair, self.order, self.stages, self.replicas)
        else:
            self.current = walk_full_recompute(model, self.order, np.empty(0, np.int64), np.empty(0, np.int64),
                                               self.mode)[1]

    @property
    def total(self) -> float:
        if self.terms is None:
            return self.current
        _, dp_stage, pp_rep = self.state
        return float(dp_stage.max() + pp_rep.max())

    @property
    def assignment(self) -> np.ndarray:
        return self.order[: self.stages * self.replicas].reshape(self.stages, self.replicas).copy()

    def run(self, count: int) -> None:
        slots = self.stages * self.replicas
        if count <= 0 or self.n_devices < 2:
            return
        first, second = draw_swaps(self.rng, count, slots, self.n_devices)
        self.evaluations += count
        if self.terms is not None:
            rowsum, dp_stage, pp_rep = self.state
            self.accepted += int(swap_search(self.dp_pair, self.pp_pair, self.stages, self.replicas, self.order,
                                             rowsum, dp_stage, pp_rep, first, second, self.mode, REL_TOL,
                                             np.empty(0)))
            return
        accepted, self.current = walk_full_recompute(self.model, self.order, first, second, self.mode, self.current)
        self.accepted += accepted


def walk_full_recompute(model: CostModel, order: np.ndarray, first: np.ndarray, second: np.ndarray, mode: int,
                        current: float | None = None) -> tuple[int, float]:
    """The swap walk of `swap_search` with one full `model.evaluate_many` per proposal (any cost model).
    `order` is updated in place; returns (accepted swaps, final total in seconds)."""
    slots = model.stages * model.replicas

    def total() -> float:
        return float(model.evaluate_many(order[:slots].reshape(1, model.stages, model.replicas))[0])

    current = total() if current is None else current
    accepted = 0
    for i, j in zip(first.tolist(), second.tolist()):
        order[i], order[j] = order[j], order[i]
        new = total()
        if (new < current * (1 - REL_TOL)) if mode == ACCEPT_STRICT else (new <= current * (1 + REL_TOL)):
            current = new
            accepted += 1
        else:
            order[i], order[j] = order[j], order[i]
    return accepted, current


def _order_from_assignment(assignment: np.ndarray, n_devices: int) -> np.ndarray:
    """Slots first (the seed's order convention), then the unused devices ascending."""
    used = assignment.reshape(-1)
    unused = np.setdiff1d(np.arange(n_devices), used)
    return np.concatenate([used, unused]).astype(np.int64)


IMPROVE_CHUNK = 32
"""With a deadline, a model without pairwise terms walks its swaps in chunks of this many, the clock read
between chunks (one full evaluation per swap: 1024 devices by "schedule" took ~30 s for one child's swaps)."""


def improve(model: CostModel, assignment: np.ndarray, iterations: int, *, strict: bool = False,
            rng: np.random.Generator | int = 0, deadline: float | None = None) -> Improvement:
    """Improve `assignment` with `iterations` random swaps (incremental when the model is pairwise).

    For use as a step inside other searches (e.g. on each child of a genetic algorithm).
    `rng`: a Generator (advanced in place) or a seed; `deadline` (time.perf_counter() seconds): a model
    without pairwise terms stops its walk there (IMPROVE_CHUNK). The total is the incremental one, which
    agrees with `model.evaluate(...).total` to ~1e-12 relative.
    """
    assignment = as_assignment(assignment, model.stages, model.replicas, model.n_devices)
    generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    walk = _Walk(model, _order_from_assignment(assignment, model.n_devices), strict, generator)
    if deadline is None or walk.terms is not None:
        walk.run(iterations)
    else:
        for done in range(0, iterations, IMPROVE_CHUNK):
            if time.perf_counter() > deadline:
                break
            walk.run(min(IMPROVE_CHUNK, iterations - done))
    return Improvement(walk.assignment, walk.total, walk.evaluations)


def local_search(
    problem: PlacementProblem,
    config: LocalSearchConfig,
    *,
    seed: int,
    time_limit_s: float | None = None,
    progress: ProgressCallback | None = None,
) -> SearchResult:
    """Best of `config.restarts` swap walks; restart k uses default_rng([seed, k]) for its start and swaps."""
    start = time.perf_counter()
    model = problem.cost_model
    total_work = config.restarts * config.iterations
    runs: list[dict] = []
    best: tuple[float, np.ndarray] | None = None
    evaluations = 0
    timed_out = False
    for restart in range(config.restarts):
        rng = np.random.default_rng([seed, restart])
        walk = _Walk(model, rng.permutation(problem.n_devices), config.strict, rng, config.incremental)
        start_total = walk.total
        done = 0
        while done < config.iterations and not timed_out:
            count = min(CHUNK, config.iterations - done)
            walk.run(count)
            done += count
            if progress is not None:
                progress(restart * config.iterations + done, total_work)
            timed_out = time_limit_s is not None and time.perf_counter() - start > time_limit_s
        evaluations += walk.evaluations
        total = float(model.evaluate(walk.assignment).total)
        runs.append({"start_total": float(start_total), "total": total, "swaps": done, "accepted": walk.accepted})
        if best is None or total < best[0]:
            best = (total, walk.assignment)
        if timed_out:
            break
    assert best is not None
    return SearchResult(
        method="local-search",
        assignment=best[1],
        cost=model.evaluate(best[1]),
        seconds=time.perf_counter() - start,
        evaluations=evaluations,
        details={
            "mode": "strict" if config.strict else "sideways",
            "incremental": config.incremental and model.pairwise_terms() is not None,
            "per_restart_totals": [run["total"] for run in runs],
            "restarts": runs,
            "best_restart": int(np.argmin([run["total"] for run in runs])),
            "timed_out": timed_out,
        },
    )
