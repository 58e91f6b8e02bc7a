"""Gradient clipping by the global L2 norm: the one clipping function of the simulated trainer,
1-bit Adam and the runtime.

    norm = clip_grad_norm_(grads, max_norm)                       # one process holds everything
    norm = clip_grad_norm_(stage_grads, max_norm, world_sum)      # a model cut into stages

The norm is sqrt(sum over tensors of |t|^2), each |t| computed by torch in the tensor's dtype and
squared in float64; `sum_squares` (optional) turns this process's sum of squares into the global
one (the runtime: one scalar all-reduce over all stages). For a single tensor the result is exactly
float(torch.linalg.vector_norm(t)). If the norm exceeds max_norm, every tensor is scaled in place by
max_norm / (norm + 1e-6) (the epsilon as torch.nn.utils.clip_grad_norm_).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

CLIP_EPS = 1e-6


def clip_grad_norm_(tensors: Sequence[torch.Tensor], max_norm: float | None,
                    sum_squares: Callable[[float], float] | None = None) -> float:
    """Scale `tensors` in place so that their global L2 norm is at most `max_norm` (None: only
    measure); return the global norm before clipping."""
    local = sum(float(torch.linalg.vector_norm(t)) ** 2 for t in tensors)
    norm = math.sqrt(local if sum_squares is None else sum_squares(local))
    if max_norm is not None and norm > max_norm:
        scale = max_norm / (norm + CLIP_EPS)
        for tensor in tensors:
            tensor.mul_(scale)
    return norm
