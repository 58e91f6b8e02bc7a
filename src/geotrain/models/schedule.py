"""Learning-rate schedule: linear warm-up, then cosine decay."""

from __future__ import annotations

import math


def lr_at(step: int, total_steps: int, peak_lr: float, warmup_steps: int | None = None,
          min_lr_ratio: float = 0.1) -> float:
    """Learning rate at 0-based `step` of `total_steps`.

    Warm-up: peak_lr * (step + 1) / warmup_steps for step < warmup_steps (default: 10% of the run,
    at least 1 step). Then cosine from peak_lr down to min_lr_ratio * peak_lr at the last step.
    Steps past the end keep the final value.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    warmup = max(1, total_steps // 10) if warmup_steps is None else warmup_steps
    if step < warmup:
        return peak_lr * (step + 1) / warmup
    decay_steps = total_steps - 1 - warmup
    progress = 1.0 if decay_steps <= 0 else min(1.0, (step - warmup) / decay_steps)
    floor = min_lr_ratio * peak_lr
    return floor + 0.5 * (peak_lr - floor) * (1.0 + math.cos(math.pi * progress))
