"""Equal or adaptive local steps on DiLoCo replicas of different speeds: each replica's inner steps per outer
period, and the period's seconds per step (geotrain.sync.adaptive runs them; cost.wan_recipe chooses).

Units: seconds. c_r: replica r's compute seconds per inner step; T: one fragment's exchange; H: `sync_every`
(the mean of the n_r); P fragments; tau: a sync's delay in inner steps; pp_s: pipeline seconds per step.

Inner steps per period n_r (`period_local_steps`): "equal": H on every replica; "adaptive": R x H shared in
proportion to 1 / c_r, integers >= 1 by largest remainder (batch_shares.split_by_weights: the rule that
sync.adaptive.adaptive_local_steps applies at run time; the runtime's first period takes it from the GPU peaks).

Seconds per step, one period over H (`period_step_seconds`):

    step_s = max(max_r (n_r c_r + P x max(0, T - d_r c_r)) / H + pp_s,  P x T / H)
    d_r    = min(n_r, max(1, round(tau x n_r / H)))   (0 without a delay)

replica r computes n_r c_r and each of the period's P syncs exposes what d_r of its own inner steps do not hide
(the exchange overlaps the next steps; sync.adaptive lands it after the same share, tau / H, of every replica's
period); the next sync starts when the last replica posts it; and one exchange at a time per DP group. With
equal steps d_r = tau; with every c_r = c and n_r = H this is the uniform formula
(wan_recipe.recipe_step_seconds). Adaptive steps make the period about R x H / sum_r (1 / c_r) + the exposed
exchange, against H x max_r c_r + the exposed exchange with equal steps. Replica r's compute fraction:
n_r c_r / (H x step_s) (`replica_compute_per_step` over step_s).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from geotrain.cost.batch_shares import split_by_weights
from geotrain.errors import GeotrainError, shown

LOCAL_STEPS = ("equal", "adaptive")
"""The runtime's optim.local_steps choices (geotrain.sync.adaptive.LOCAL_STEPS)."""
ADAPTIVE_MAX_DELAY: int | None = None
"""The largest delay tau the planner prices with adaptive local steps: None (up to H - 1, as with equal steps) as
the runtime runs adaptive steps with a sync delay (sync.adaptive); 0 where a runtime refuses them.
tests/unit/cost/test_cost_local_steps.py holds it to the runtime."""


class LocalStepsError(GeotrainError, ValueError):
    """Local-step settings or per-replica compute seconds that cannot be priced."""


def replica_seconds(replica_compute_s: float | Sequence[float]) -> np.ndarray:
    """(R,) compute seconds per inner step, each finite and > 0 (one number: one replica)."""
    seconds = np.atleast_1d(np.asarray(replica_compute_s, dtype=np.float64))
    if seconds.ndim != 1 or seconds.size == 0 or not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
        raise LocalStepsError(f"compute seconds per step: finite numbers > 0, one per replica, got "
                              f"{shown(replica_compute_s)}")
    return seconds


def period_local_steps(replica_compute_s: float | Sequence[float], sync_every: int, local_steps: str) -> np.ndarray:
    """(R,) inner steps per outer period n_r (module doc): H each ("equal"), or R x H by speed ("adaptive")."""
    seconds = replica_seconds(replica_compute_s)
    if local_steps not in LOCAL_STEPS:
        raise LocalStepsError(f"local steps must be one of {', '.join(LOCAL_STEPS)}, got {shown(local_steps)}")
    if local_steps == "equal" or seconds.size == 1:
        return np.full(seconds.size, int(sync_every), dtype=np.int64)
    return np.asarray(split_by_weights(1.0 / seconds, seconds.size * int(sync_every)), dtype=np.int64)


def replica_compute_per_step(replica_compute_s: float | Sequence[float], local_steps: Sequence[int],
                             sync_every: int) -> np.ndarray:
    """(R,) compute seconds per step (a period's n_r c_r over H)."""
    return replica_seconds(replica_compute_s) * np.asarray(local_steps, dtype=np.float64) / sync_every


def period_step_seconds(sync_s: float, replica_compute_s: float | Sequence[float], local_steps: Sequence[int],
                        sync_every: int, fragments: int, delay: int, pp_s: float = 0.0) -> float:
    """step_s of the module doc: the slowest replica's compute and exposed exchanges of a period, over H, plus
    the pipeline; at least the DP group's occupancy (P exchanges of `sync_s` per H steps)."""
    seconds = replica_seconds(replica_compute_s)
    steps = np.asarray(local_steps, dtype=np.float64)
    hiding = np.minimum(steps, np.maximum(1.0, np.round(delay * steps / sync_every))) if delay > 0 else 0.0
    exposed = np.maximum(0.0, sync_s - hiding * seconds)
    busiest = np.max(steps * seconds + fragments * exposed)
    return float(max(busiest / sync_every + pp_s, sync_s * fragments / sync_every))
