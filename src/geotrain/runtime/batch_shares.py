"""Speed-proportional batch shares for per-step data parallelism (`train --batch-shares`).

The global batch of a step is the same N = R x batch_size windows whatever the shares (the data
stream's `window_starts` of (seed, step)); replica r takes the n_r consecutive windows from offset
o_r = n_0 + ... + n_{r-1}, with sum n_r = N and every n_r a positive multiple of the micro-batch
count M (each micro-batch of a replica has n_r / M sequences).

Exactness: replica r's gradient g_r is the mean-loss gradient over its n_r windows (torch's pipeline
schedules divide the micro-batch sum by M). Before the DP exchange, which averages over the R replicas,
each replica multiplies g_r by `gradient_factor` = R n_r / N, so the exchange's mean is
(1/R) sum_r R (n_r / N) g_r = (1/N) sum over all N windows of their gradients: the full-batch gradient,
for any exchange that computes a mean (lossy codecs then approximate it as they approximate any mean).

Rules: "equal" (n_r = batch_size), "speed" (n_r proportional to replica r's speed: the peak FLOP/s of
its slowest device over the pipeline, cost/gpus.py), "measured" (speed at first, then after every
REBALANCE_EVERY steps n_r proportional to n_r / c_r, c_r the replica's mean measured compute seconds
over those steps, the same on every rank from one MAX all-reduce: cost.batch_shares.rebalanced_samples;
this also catches a site that slows down), or explicit weights "W1,W2,..." (one per replica, > 0). Rounding is in units of M samples by largest remainder, each replica at least one unit
(geotrain.cost.batch_shares: the planner and benches use the same split).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from geotrain.cluster import Cluster
from geotrain.cost.batch_shares import SHARE_RULES, BatchSharesError, share_samples

__all__ = ["SHARE_RULES", "BatchSharesError", "batch_shares", "gradient_factor", "parse_batch_shares",
           "share_offset", "weight_gradients"]


def parse_batch_shares(text: str) -> str | tuple[float, ...]:
    """"equal", "speed" or a tuple of weights (each a finite number > 0) from "W1,W2,..."."""
    value = str(text).strip()
    if value in SHARE_RULES:
        return value
    try:
        weights = tuple(float(part) for part in value.split(","))
    except ValueError:
        weights = ()
    if not weights or not all(math.isfinite(w) and w > 0 for w in weights):
        raise BatchSharesError(f"batch_shares: equal, speed or weights W1,W2,... (numbers > 0, one per replica), "
                               f"got {value!r}")
    return weights


def batch_shares(rule: str | tuple[float, ...], cluster: Cluster, assignment: np.ndarray, batch_size: int,
                 microbatches: int = 1) -> tuple[int, ...]:
    """Sequences per replica of one step (cost.batch_shares.share_samples with unit = `microbatches`): R
    ints summing to R x `batch_size`, each a positive multiple of `microbatches`."""
    return share_samples(rule, cluster, assignment, batch_size, microbatches)


def share_offset(shares: Sequence[int], replica: int) -> int:
    """Index of replica `replica`'s first window in the step's global batch."""
    return int(sum(shares[:replica]))


def gradient_factor(shares: Sequence[int], replica: int) -> float:
    """R n_r / N: what replica r's mean gradient is multiplied by so the DP mean is the full-batch one."""
    return len(shares) * shares[replica] / sum(shares)


@torch.no_grad()
def weight_gradients(params: Sequence[torch.nn.Parameter], factor: float) -> None:
    """Multiply every existing gradient by `factor` in place (nothing when it is 1)."""
    if factor == 1.0:
        return
    for p in params:
        if p.grad is not None:
            p.grad.mul_(factor)


REBALANCE_EVERY = 3
"""--batch-shares measured: re-balance after every this many steps, from their mean compute per replica."""


def rebalance_due(rule: str, step: int) -> bool:
    """Whether the shares are re-balanced after 0-based `step` (measured only)."""
    return rule == "measured" and (step + 1) % REBALANCE_EVERY == 0


def replica_compute_s(mean_compute_s: float, replica: int, replicas: int) -> np.ndarray:
    """(R,) every replica's compute seconds (the slowest of its stages): this rank's `mean_compute_s` in its
    replica's slot, the max over the world (a collective: every rank calls it at the same step)."""
    import torch.distributed as dist

    values = torch.zeros(replicas, dtype=torch.float64)
    values[replica] = mean_compute_s
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values.numpy()
