"""What every model adapter accepts: the build options, the spec error, a seeded build."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from geotrain.errors import GeotrainError


class ModelSpecError(GeotrainError, ValueError):
    """A --model spec cannot be resolved: unknown form, missing file or function, wrong return type."""


@dataclass(frozen=True)
class ModelOptions:
    """Build options; None keeps the model's own value.

    seed: seeds torch's RNG (forked, so the global RNG is untouched) while the model is built, so every
    rank building the same spec gets the same weights. vocab_size, context (tokens) and n_layer
    override the shape of models built from a config (tiny, hf presets, config.json); user
    functions and local weights keep theirs. build_timeout_s bounds a user file's import plus its
    function's call (seconds; a builder that never returns is then a ModelSpecError).
    """

    seed: int = 0
    vocab_size: int | None = None
    context: int | None = None
    n_layer: int | None = None
    build_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 < self.build_timeout_s < float("inf"):
            raise ModelSpecError(f"model option build_timeout_s must be a finite number > 0, got {self.build_timeout_s}")
        for name in ("vocab_size", "context", "n_layer"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ModelSpecError(f"model option {name} must be >= 1, got {value}")


@contextlib.contextmanager
def seeded_build(seed: int) -> Iterator[None]:
    """Run the block with torch's CPU RNG seeded by `seed`, restoring the caller's RNG state after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
