"""Batch shares on a heterogeneous cluster: how many of a step's samples each replica takes, and what
per-step data parallelism then costs.

Units: samples are sequences; speeds are peak FLOP/s (cost/gpus.py); seconds are per training step.

Shares (`share_samples`): "equal" (the global batch / R each), "speed" (proportional to each replica's
speed: the peak FLOP/s of its slowest device over the pipeline stages) or explicit weights; rounded in
units of `unit` samples (the runtime's micro-batch count) by largest remainder, every replica at least
one unit, the sum the global batch.

Prediction (`predict_shares`): replica r's compute with equal shares is c_r = compute_s x v_min / v_r
(`compute_s`: the slowest replica's, v: replica speeds); with n_r samples of a batch of b per replica it
is c_r n_r / b. A per-step DP step is max_r c_r(n) + comm_s (the DP exchange and pipeline seconds, not
overlapped) and site r computes c_r(n) / step_s of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.layer_split import device_peak_flops
from geotrain.errors import GeotrainError

SHARE_RULES = ("equal", "speed", "measured")
"""measured: starts as speed; the runtime then re-balances from measured compute (runtime/batch_shares.py)."""


class BatchSharesError(GeotrainError, ValueError):
    """Batch shares that cannot be used (names the value and what is allowed)."""


def replica_speeds(cluster: Cluster, assignment: Any) -> np.ndarray:
    """(R,) peak FLOP/s of each replica: its slowest device over the stages (the pipeline's pace)."""
    peaks = device_peak_flops(cluster)
    return peaks[np.asarray(assignment, dtype=np.int64)].min(axis=0)


def split_by_weights(weights: Sequence[float], global_batch: int, unit: int = 1) -> tuple[int, ...]:
    """Samples per replica (multiples of `unit`, each >= unit, sum `global_batch`) proportional to
    `weights` by largest remainder (ties: the lower replica index)."""
    weights = np.asarray(weights, dtype=float)
    units, replicas = global_batch // unit, len(weights)
    if global_batch % unit or units < replicas:
        raise BatchSharesError(f"batch_shares: a global batch of {global_batch} cannot give {replicas} replicas "
                               f"at least {unit} samples each in multiples of {unit}")
    ideal = units * weights / weights.sum()
    counts = np.maximum(np.floor(ideal).astype(np.int64), 1)
    while counts.sum() > units:  # the floor of one unit over-gave: take from the most over-served
        over = np.where(counts > 1, counts - ideal, -np.inf)
        counts[int(np.argmax(over))] -= 1
    while counts.sum() < units:
        counts[int(np.argmax(ideal - counts))] += 1
    return tuple(int(c) * unit for c in counts)


def share_samples(rule: str | tuple[float, ...], cluster: Cluster, assignment: Any, batch_size: int,
                  unit: int = 1) -> tuple[int, ...]:
    """Samples per replica of one step for `rule` ("equal", "speed" or one weight per replica; "measured"
    starts as "speed") on the plan
    `assignment` (S, R) of `cluster`: R ints summing to R x `batch_size` (samples per replica with equal
    shares), each a positive multiple of `unit`."""
    replicas = np.asarray(assignment).shape[1]
    if rule == "equal":
        return (batch_size,) * replicas
    if rule in ("speed", "measured"):
        weights: Sequence[float] = replica_speeds(cluster, assignment)
    elif isinstance(rule, tuple):
        if len(rule) != replicas:
            raise BatchSharesError(f"batch_shares: {len(rule)} weights for {replicas} replicas")
        weights = rule
    else:
        raise BatchSharesError(f"batch_shares: equal, speed or a tuple of weights, got {rule!r}")
    return split_by_weights(weights, replicas * batch_size, unit)


@dataclass(frozen=True)
class SharesPrediction:
    """Per-step data parallelism with `samples` per replica: seconds per step and per replica."""

    samples: tuple[int, ...]
    compute_s: tuple[float, ...]  # per replica, per step
    comm_s: float
    step_s: float

    @property
    def compute_fraction(self) -> tuple[float, ...]:
        """Per replica: compute seconds over step seconds."""
        return tuple(c / self.step_s for c in self.compute_s)

    def to_json(self, names: Sequence[str] | None = None) -> dict[str, Any]:
        """`names`: a label per replica (e.g. its sites) for the compute fractions (default r0, r1, ...)."""
        labels = names if names is not None else [f"r{r}" for r in range(len(self.samples))]
        return {"samples": list(self.samples), "compute_s": list(self.compute_s), "comm_s": self.comm_s,
                "step_s": self.step_s, "site_compute_fraction": dict(zip(labels, self.compute_fraction))}


def replica_compute_seconds(cluster: Cluster, assignment: Any, compute_s: float) -> np.ndarray:
    """(R,) each replica's compute seconds per step with equal shares, c_r = `compute_s` (the slowest
    replica's) x v_min / v_r."""
    speeds = replica_speeds(cluster, assignment)
    return compute_s * speeds.min() / speeds


def predict_shares(cluster: Cluster, assignment: Any, samples: Sequence[int], compute_s: float,
                   comm_s: float) -> SharesPrediction:
    """The module doc's prediction: `compute_s` the slowest replica's compute per step with equal shares,
    `comm_s` the step's communication seconds (DP + pipeline)."""
    return predict_shares_of(replica_compute_seconds(cluster, assignment, compute_s), samples, comm_s)


def predict_shares_of(replica_compute_s: Sequence[float], samples: Sequence[int], comm_s: float) -> SharesPrediction:
    """The prediction from each replica's compute seconds per step with equal shares (e.g. measured)."""
    per_replica = sum(samples) / len(samples)
    compute = tuple(float(c * n / per_replica) for c, n in zip(replica_compute_s, samples, strict=True))
    return SharesPrediction(tuple(int(n) for n in samples), compute, float(comm_s), max(compute) + float(comm_s))


def replica_labels(cluster: Cluster, assignment: Any) -> list[str]:
    """Each replica's label: its devices' names joined by '+' (one device per replica: its name)."""
    assignment = np.asarray(assignment, dtype=np.int64)
    return ["+".join(cluster.device_names[d] for d in assignment[:, r]) for r in range(assignment.shape[1])]


def rebalanced_samples(samples: Sequence[int], compute_s: Sequence[float], unit: int = 1) -> tuple[int, ...]:
    """New shares from measured compute seconds per replica with `samples`: n_r' proportional to n_r / c_r
    (each replica's measured throughput), rounded as split_by_weights. With c_r = a_r + b_r n_r (a part that
    does not grow with the batch) repeating it converges to equal c_r. A replica without measured compute
    (c_r <= 0) keeps its weight n_r / mean(c)."""
    compute = np.asarray(compute_s, dtype=float)
    known = compute[compute > 0]
    if known.size == 0:
        return tuple(int(n) for n in samples)
    compute = np.where(compute > 0, compute, known.mean())
    return split_by_weights(np.asarray(samples, dtype=float) / compute, int(sum(samples)), unit)


def heterogeneous(cluster: Cluster, assignment: Any) -> bool:
    """Whether the plan's replicas differ in speed (replica_speeds)."""
    speeds = replica_speeds(cluster, assignment)
    return bool(np.any(speeds != speeds[0]))


@dataclass(frozen=True)
class SharesChoice:
    """`plan --wan-recipe auto` on a heterogeneous cluster: per-step DP with speed shares against the WAN
    recipe (equal shares, every H steps a sync; equal or adaptive local steps), by predicted seconds per step;
    the lower wins."""

    shares: SharesPrediction  # per-step DP, speed shares
    equal: SharesPrediction  # per-step DP, equal shares (for comparison)
    recipe_step_s: float
    recipe_compute_s: tuple[float, ...]  # per replica, per step of the recipe

    @property
    def chosen(self) -> str:
        return "batch_shares" if self.shares.step_s < self.recipe_step_s else "wan_recipe"

    @property
    def step_s(self) -> float:
        return self.shares.step_s if self.chosen == "batch_shares" else self.recipe_step_s

    @property
    def compute_fraction(self) -> tuple[float, ...]:
        """Per replica, of the chosen recipe: its compute seconds over the step's."""
        if self.chosen == "batch_shares":
            return self.shares.compute_fraction
        return tuple(c / self.recipe_step_s for c in self.recipe_compute_s)

    def to_json(self, names: Sequence[str]) -> dict[str, Any]:
        """The plan's "site_compute" object: what was chosen, its step and per-site compute fractions, and
        the candidates' predicted steps."""
        return {"version": 1, "chosen": self.chosen, "step_s": self.step_s,
                "site_compute_fraction": dict(zip(names, self.compute_fraction)),
                "candidates_step_s": {"batch_shares": self.shares.step_s, "wan_recipe": self.recipe_step_s,
                                      "equal_per_step": self.equal.step_s}}


def choose_shares(cluster: Cluster, assignment: Any, global_batch: int, compute_s: float, comm_s: float,
                  recipe_step_s: float, recipe_compute_s: Sequence[float] | None = None) -> SharesChoice:
    """Speed shares of `global_batch` samples (unit 1) with per-step DP (`comm_s` per step: the DP exchange
    and pipeline seconds; `compute_s`: the slowest replica's compute per step with equal shares) against a
    recipe of `recipe_step_s` whose replicas compute `recipe_compute_s` seconds per step (None: as with equal
    shares; with adaptive local steps they differ)."""
    replicas = np.asarray(assignment).shape[1]
    if global_batch % replicas:
        raise BatchSharesError(f"batch_shares: global batch {global_batch} is not a multiple of {replicas} replicas")
    per_replica = global_batch // replicas
    equal = predict_shares(cluster, assignment, (per_replica,) * replicas, compute_s, comm_s)
    speed = predict_shares(cluster, assignment, share_samples("speed", cluster, assignment, per_replica), compute_s,
                           comm_s)
    recipe = equal.compute_s if recipe_compute_s is None else tuple(float(c) for c in recipe_compute_s)
    return SharesChoice(speed, equal, float(recipe_step_s), recipe)
