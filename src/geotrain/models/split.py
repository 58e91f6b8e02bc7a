"""Cut a layer list into S contiguous stages minimising the slowest stage's time.

Stage s holds layers [b_s, b_{s+1}) and runs on a device of relative speed w_s, so its time is
sum(costs[b_s:b_{s+1}]) / w_s. `split_layers` returns boundaries minimising max_s of that time
(every stage non-empty) by an exact dynamic programme over prefix sums, O(S * L^2) with numpy;
`split_layers_reference` enumerates every cut and is the plain reference a test holds it to.
Costs are any additive per-layer measure: parameter counts, FLOPs, measured seconds. The stage
speeds of a plan are `stage_speeds` (cost/layer_split.py: each stage's slowest replica's device).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from geotrain.cost.layer_split import stage_speeds
from geotrain.models.layers import LayerModelError, check_boundaries

__all__ = ["split_layers", "split_layers_reference", "stage_speeds", "stage_times"]


def _check(costs: Sequence[float], stages: int, weights: Sequence[float] | None) -> tuple[np.ndarray, np.ndarray]:
    cost = np.asarray(costs, dtype=np.float64)
    if cost.ndim != 1 or not 1 <= stages <= cost.size:
        raise LayerModelError(f"cannot cut {cost.size} layers into {stages} stages (need 1 <= stages <= layers)")
    if not np.all(np.isfinite(cost)) or np.any(cost < 0):
        raise LayerModelError(f"layer costs must be finite and >= 0, got {cost[:8].tolist()}")
    speed = np.ones(stages) if weights is None else np.asarray(weights, dtype=np.float64)
    if speed.shape != (stages,) or not np.all(np.isfinite(speed)) or np.any(speed <= 0):
        raise LayerModelError(f"stage weights must be {stages} finite speeds > 0, got {np.ravel(speed)[:8].tolist()}")
    return cost, speed


def stage_times(costs: Sequence[float], boundaries: Sequence[int], weights: Sequence[float] | None = None) -> np.ndarray:
    """Time of each stage: summed layer costs over the stage's speed (shape (S,))."""
    cuts = check_boundaries(boundaries, len(costs))
    cost, speed = _check(costs, len(cuts) - 1, weights)
    return np.array([cost[a:b].sum() for a, b in zip(cuts, cuts[1:])]) / speed


def split_layers(costs: Sequence[float], stages: int, weights: Sequence[float] | None = None) -> tuple[int, ...]:
    """Boundaries (0, b_1, ..., len(costs)) minimising the slowest stage's time; weights = per-stage speeds.

    Exact dynamic programme: best[s, j] = the smallest bottleneck covering layers [0, j) with
    stages 0..s-1 = min over i of max(best[s-1, i], (P[j] - P[i]) / w_{s-1}), P the prefix sums.
    Ties are broken deterministically (the same costs always give the same cut).
    """
    cost, speed = _check(costs, stages, weights)
    n = cost.size
    prefix = np.concatenate([[0.0], np.cumsum(cost)])
    span = prefix[None, :] - prefix[:, None]                  # span[i, j] = cost of layers [i, j)
    i_idx, j_idx = np.indices((n + 1, n + 1))
    best = np.where(np.arange(n + 1) >= 1, prefix / speed[0], np.inf)
    choice = np.zeros((stages, n + 1), dtype=np.int64)
    for s in range(1, stages):
        candidate = np.maximum(best[:, None], span / speed[s])
        candidate[(i_idx >= j_idx) | (i_idx < s)] = np.inf    # stage s needs >= 1 layer; earlier ones need s
        choice[s] = np.argmin(candidate, axis=0)
        best = candidate[choice[s], np.arange(n + 1)]
    cuts = [n]
    for s in range(stages - 1, 0, -1):
        cuts.append(int(choice[s, cuts[-1]]))
    cuts.append(0)
    return tuple(reversed(cuts))


def split_layers_reference(costs: Sequence[float], stages: int,
                           weights: Sequence[float] | None = None) -> tuple[int, ...]:
    """Plain reference of split_layers: try every set of S-1 cut points, keep the first best."""
    cost, speed = _check(costs, stages, weights)
    n = cost.size
    best_cuts, best_time = None, float("inf")
    for inner in itertools.combinations(range(1, n), stages - 1):
        cuts = (0, *inner, n)
        slowest = 0.0
        for s in range(stages):
            total = 0.0
            for layer in range(cuts[s], cuts[s + 1]):
                total += float(cost[layer])
            slowest = max(slowest, total / float(speed[s]))
        if slowest < best_time:
            best_cuts, best_time = cuts, slowest
    assert best_cuts is not None
    return best_cuts
