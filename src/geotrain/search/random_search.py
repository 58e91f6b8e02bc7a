"""Random placement: N uniformly random assignments; reports the best and the mean (the seed's baseline)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from geotrain.search.base import PlacementProblem, ProgressCallback, SearchError, SearchResult


@dataclass(frozen=True)
class RandomSearchConfig:
    """samples: how many random assignments to score (the seed uses 200)."""

    samples: int = 200

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise SearchError(f"random: samples must be >= 1, got {self.samples}")


def random_assignments(n_devices: int, stages: int, replicas: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """(count, S, R) assignments, each the first S*R entries of a uniform device permutation."""
    orders = np.argsort(rng.random((count, n_devices)), axis=1)
    return orders[:, : stages * replicas].reshape(count, stages, replicas)


def random_search(
    problem: PlacementProblem,
    config: RandomSearchConfig,
    *,
    seed: int,
    time_limit_s: float | None = None,
    progress: ProgressCallback | None = None,
) -> SearchResult:
    """Score `config.samples` random assignments in batches; stops early at the time limit."""
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    model = problem.cost_model
    totals: list[np.ndarray] = []
    best_assignment, best_total = None, np.inf
    done, batch = 0, 256
    while done < config.samples:
        count = min(batch, config.samples - done)
        candidates = random_assignments(problem.n_devices, problem.stages, problem.replicas, count, rng)
        scores = model.evaluate_many(candidates)
        totals.append(scores)
        i = int(np.argmin(scores))
        if scores[i] < best_total:
            best_total, best_assignment = float(scores[i]), candidates[i]
        done += count
        if progress is not None:
            progress(done, config.samples)
        if time_limit_s is not None and time.perf_counter() - start > time_limit_s:
            break
    all_totals = np.concatenate(totals)
    return SearchResult(
        method="random",
        assignment=best_assignment,
        cost=model.evaluate(best_assignment),
        seconds=time.perf_counter() - start,
        evaluations=int(all_totals.size),
        details={"samples": int(all_totals.size), "mean_total": float(all_totals.mean()),
                 "worst_total": float(all_totals.max()), "best_total": best_total},
    )
