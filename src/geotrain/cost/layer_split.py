"""Per-stage layer shares for the compute-aware cost models: equal (1/S), fixed fractions, or the
speed-optimal uneven split of the job's layers for each assignment.

A stage's devices run synchronously in its DP group, so a stage is as fast as its slowest replica:
w_s = min over r of peak FLOP/s of assignment[s][r] (`stage_speeds`). With L layers of equal cost,
the split minimising the slowest stage's time max_s n_s / w_s (n_s >= 1 layers, sum n_s = L) is found
in closed form (`speed_layer_counts`): the bottleneck T* is the smallest candidate k / w_s with
sum_s floor(T* w_s) >= L and floor(T* w_s) >= 1; it lies in [max(L/W, 1/w_min), max((L+S)/W, 1/w_min)]
(W = sum w_s), which holds at most S + 1 candidates k / w_s per stage. Then n_s = floor(T* w_s) less
the surplus, one layer per stage per pass from the slowest stages first (each keeps >= 1 layer);
among equal speeds the later stage gives first, so equal speeds give models.even_boundaries' cut
(earlier stages take the remainder). Vectorised over any leading axes.
models.split.split_layers (an exact DP for any per-layer costs) reaches the same bottleneck; a test
holds the two together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.gpus import gpu_peak_flops
from geotrain.errors import GeotrainError

_ROUND = 1e-12
"""Relative slack on floor(T w): k / w_s x w_s must floor to k, not k - 1, despite rounding."""


class LayerSplitError(GeotrainError, ValueError):
    """Invalid layer shares (count, sign, sum) or an impossible split (fewer layers than stages)."""


def device_peak_flops(cluster: Cluster) -> np.ndarray:
    """(N,) peak dense fp16 FLOP/s of every device of `cluster` (cost/gpus.py)."""
    return np.array([gpu_peak_flops(gpu) for gpu in cluster.gpus], dtype=np.float64)


def device_slowdowns(cluster: Cluster) -> np.ndarray:
    """(N,) how many times slower each device computes than the cluster's fastest: the fastest GPU's peak
    FLOP/s over the device's (1 for the fastest). UnknownGpuError for a gpu type without a known peak."""
    peaks = device_peak_flops(cluster)
    return peaks.max() / peaks


def stage_speeds(assignments: Any, device_speeds: Any) -> np.ndarray:
    """Speed of each stage of (..., S, R) assignments: its slowest replica's device (synchronous DP
    waits for it). `device_speeds` (N,): any per-device speed (peak FLOP/s, relative TFLOP/s)."""
    devices = np.asarray(assignments, dtype=np.int64)
    speeds = np.asarray(device_speeds, dtype=np.float64)
    if devices.ndim < 2 or devices.size == 0 or devices.min() < 0 or devices.max() >= speeds.size:
        raise LayerSplitError(f"assignment must be a (stages, replicas) array of device indices "
                              f"0..{speeds.size - 1}, got shape {devices.shape}")
    return speeds[devices].min(axis=-1)


def speed_layer_counts(n_layers: int, speeds: Any) -> np.ndarray:
    """Layers per stage (..., S) int64 minimising max_s n_s / speeds[..., s] over n_layers equal layers
    (every stage >= 1 layer; see the module docstring for the closed form and the tie rule)."""
    w = np.asarray(speeds, dtype=np.float64)
    S = w.shape[-1]
    if isinstance(n_layers, bool) or not isinstance(n_layers, (int, np.integer)) or not 1 <= S <= n_layers:
        raise LayerSplitError(f"cannot cut {n_layers!r} layers into {S} stages (need 1 <= stages <= layers)")
    if not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise LayerSplitError(f"stage speeds must be finite and > 0, got {np.ravel(w)[:8].tolist()}")
    total, slowest = w.sum(axis=-1, keepdims=True), w.min(axis=-1, keepdims=True)
    low = np.maximum(n_layers / total, 1.0 / slowest)                      # (..., 1)
    first = np.maximum(np.floor(low * w * (1.0 - _ROUND)), 1.0)            # (..., S): smallest k worth trying
    k = first[..., :, None] + np.arange(S + 2)                             # (..., S, S+2)
    candidates = (k / w[..., :, None]).reshape(*w.shape[:-1], -1)          # (..., C)
    counts = np.floor(candidates[..., :, None] * w[..., None, :] * (1.0 + _ROUND))   # (..., C, S)
    feasible = (counts.sum(axis=-1) >= n_layers) & (counts.min(axis=-1) >= 1)
    best = np.where(feasible, candidates, np.inf).min(axis=-1, keepdims=True)         # (..., 1)
    n = np.floor(best * w * (1.0 + _ROUND)).astype(np.int64)
    surplus = n.sum(axis=-1) - n_layers
    # one layer per stage per pass, slowest stage first; among equal speeds the later one
    # (stable sort of the reversed stages)
    order = S - 1 - np.argsort(w[..., ::-1], axis=-1, kind="stable")
    while np.any(surplus > 0):
        ordered = np.take_along_axis(n, order, axis=-1)
        eligible = ordered > 1
        drop = eligible & (np.cumsum(eligible, axis=-1) <= surplus[..., None])
        np.put_along_axis(n, order, ordered - drop, axis=-1)
        surplus = surplus - drop.sum(axis=-1)
    return n


def counts_to_boundaries(counts: Sequence[int]) -> tuple[int, ...]:
    """(0, b_1, ..., L) cut points of stages holding `counts` layers each."""
    return (0, *(int(b) for b in np.cumsum(np.asarray(counts, dtype=np.int64))))


def check_fractions(fractions: Any, stages: int, source: str = "layer_shares") -> np.ndarray:
    """(S,) per-stage fractions of the layers: finite, > 0, summing to 1 (within 1e-9)."""
    shares = np.asarray(fractions, dtype=np.float64)
    if shares.shape != (stages,) or not np.all(np.isfinite(shares)) or np.any(shares <= 0) \
            or abs(float(shares.sum()) - 1.0) > 1e-9:
        raise LayerSplitError(f"{source}: must be {stages} fractions > 0 summing to 1, "
                              f"got {np.ravel(shares)[:8].tolist()}")
    return shares


SHARE_RULES = ("equal", "speed")


@dataclass(frozen=True, eq=False)
class StageShares:
    """How a compute-aware cost model shares the job's `layers` over S stages.

    `rule` "equal": 1/S each (the models' default); "speed": `speed_layer_counts` of each assignment's
    stage speeds over `device_speeds` (N,); or `fractions` (S,) fixed for every assignment."""

    stages: int
    layers: int
    rule: str = "equal"
    device_speeds: np.ndarray | None = None
    fractions: np.ndarray | None = None
    _memo: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    """Speed-rule counts by stage-speed pattern (a few GPU types give few patterns; searches repeat them)."""

    @classmethod
    def build(cls, spec: Any, stages: int, layers: int, device_speeds: np.ndarray) -> StageShares | None:
        """None (spec None or "equal": the models' own 1/S path), "speed", or S fixed fractions."""
        if spec is None or (isinstance(spec, str) and spec == "equal"):
            return None
        if isinstance(spec, str):
            if spec != "speed":
                raise LayerSplitError(f"layer_shares: must be one of {', '.join(SHARE_RULES)} or {stages} "
                                      f"fractions, got {spec!r}")
            speed_layer_counts(layers, np.ones(stages))  # validates layers >= stages
            return cls(stages, layers, "speed", np.asarray(device_speeds, dtype=np.float64))
        return cls(stages, layers, "fixed", fractions=check_fractions(spec, stages))

    def counts(self, assignments: Any) -> np.ndarray:
        """(..., S) layers per stage of the speed rule for (..., S, R) assignments (speed_layer_counts,
        computed once per distinct pattern of stage speeds)."""
        assert self.device_speeds is not None
        speeds = stage_speeds(assignments, self.device_speeds)
        levels = np.unique(self.device_speeds)
        if len(levels) ** self.stages >= 2**62:  # the pattern code would overflow: compute directly
            return speed_layer_counts(self.layers, speeds)
        code = (np.searchsorted(levels, speeds) * len(levels) ** np.arange(self.stages)).sum(axis=-1)
        patterns, first, inverse = np.unique(code.ravel(), return_index=True, return_inverse=True)
        flat = speeds.reshape(-1, self.stages)
        new = [i for i, pattern in enumerate(patterns.tolist()) if pattern not in self._memo]
        if new:
            found = speed_layer_counts(self.layers, flat[first[new]])
            self._memo.update(zip(patterns[new].tolist(), found))
        table = np.stack([self._memo[pattern] for pattern in patterns.tolist()])
        return table[inverse.ravel()].reshape(speeds.shape)

    def of(self, assignments: Any) -> np.ndarray:
        """(..., S) fraction of the layers each stage holds, for (..., S, R) assignments."""
        if self.rule == "speed":
            return self.counts(assignments) / float(self.layers)
        assert self.fractions is not None
        shape = np.shape(assignments)[:-1]
        return np.broadcast_to(self.fractions, shape)

    def describe(self, assignment: Any) -> dict[str, Any]:
        """The split of one (S, R) assignment for a plan file: rule, layers, counts (speed rule),
        boundaries, shares and the stage speeds in TFLOP/s (speed rule)."""
        shares = self.of(assignment)
        doc: dict[str, Any] = {"rule": self.rule, "layers": self.layers}
        if self.rule == "speed":
            counts = self.counts(assignment)
            doc["counts"] = [int(c) for c in counts]
            doc["boundaries"] = list(counts_to_boundaries(counts))
            assert self.device_speeds is not None
            doc["stage_tflops"] = [float(s) / 1e12 for s in stage_speeds(assignment, self.device_speeds)]
        doc["shares"] = [float(s) for s in shares]
        return doc
