"""Configuration and result of simulated data-parallel training with compressed gradients."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from geotrain.codecs import CODECS
from geotrain.errors import GeotrainError
from geotrain.models import TINY_2LAYER_GPT, GPTConfig
from geotrain.optim.registry import SIM_OPTIMIZERS


class TrainingConfigError(GeotrainError, ValueError):
    """A training option is out of range."""


DEFAULT_LR = {"adamw": 3e-3, "sgd": 0.3}
"""Peak learning rates of the seed: AdamW as lecture 1, SGD with momentum for the error-feedback table."""


@dataclass(frozen=True)
class TrainConfig:
    """One training run: p simulated workers share each batch of `batch` sequences equally.

    codec / codec_params: a `geotrain.codecs` name and its parameters (e.g. {"fraction": 0.01}).
    error_feedback: each worker keeps its own residual of what compression dropped.
    optimizer: "adamw" (betas, weight_decay) or "sgd" (momentum) (optim.registry.SIM_OPTIMIZERS); lr None -> DEFAULT_LR.
    clip_norm: clip the aggregated gradient to this global L2 norm; None: no clipping.
    seed: model initialisation; batches are drawn from a generator seeded with seed + 1.
    """

    codec: str = "none"
    codec_params: Mapping[str, Any] = field(default_factory=dict)
    error_feedback: bool = False
    optimizer: str = "adamw"
    lr: float | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    momentum: float = 0.9
    clip_norm: float | None = 1.0
    warmup_steps: int | None = None
    steps: int = 300
    workers: int = 4
    batch: int = 32
    seed: int = 0
    model: GPTConfig = TINY_2LAYER_GPT

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise TrainingConfigError(f"codec must be one of {', '.join(CODECS)}, got {self.codec!r}")
        if self.optimizer not in SIM_OPTIMIZERS:
            raise TrainingConfigError(f"optimizer must be one of {', '.join(SIM_OPTIMIZERS)}, got {self.optimizer!r}")
        for name in ("steps", "workers", "batch"):
            if getattr(self, name) < 1:
                raise TrainingConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch % self.workers:
            raise TrainingConfigError(f"batch={self.batch} must be divisible by workers={self.workers}")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise TrainingConfigError(f"clip_norm must be > 0 or None, got {self.clip_norm}")
        if self.lr is not None and not self.lr > 0:
            raise TrainingConfigError(f"lr must be > 0, got {self.lr}")

    @property
    def peak_lr(self) -> float:
        return DEFAULT_LR[self.optimizer] if self.lr is None else self.lr


@dataclass(frozen=True)
class TrainingResult:
    """What a run measured.

    val_bpc: bits per character on the validation text after training.
    bytes_per_value: wire bytes per gradient value per worker, averaged over steps (fp32 = 4.0).
    total_bytes_sent: wire bytes sent by all workers over the whole run.
    losses: training loss (nats per character, mean over workers) at each step.
    diverged_at_step: the step whose loss or gradient was NaN/inf (training stopped), or None.
    """

    val_bpc: float
    bytes_per_value: float
    total_bytes_sent: int
    losses: tuple[float, ...]
    n_params: int
    workers: int
    seconds: float
    diverged_at_step: int | None = None

    @property
    def traffic_vs_fp32(self) -> float:
        """Traffic relative to sending fp32 gradients."""
        return self.bytes_per_value / 4.0
