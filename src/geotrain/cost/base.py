"""What every cost model returns, and the interface search relies on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class CostBreakdown:
    """Communication seconds per iteration: dp = max over stages, pp = max over replicas,
    total = the model's combination (dp + pp for "yuan"). `extra` holds model-specific terms (seconds)."""

    dp: float
    pp: float
    total: float
    dp_per_stage: np.ndarray
    pp_per_replica: np.ndarray
    extra: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, float]:
        return {"dp": self.dp, "pp": self.pp, "total": self.total, **self.extra}


@dataclass(frozen=True)
class PairwiseTerms:
    """A model of the form dp_s = max_{i in group s} sum_{j in group s} dp_pair_s[i, j] and
    pp_r = sum over consecutive stages of pp_pair_s[d_s, d_s+1]; total = max dp_s + max pp_r.
    Search uses these N x N matrices (seconds, zero diagonal) for incremental swap evaluation."""

    dp_pair_s: np.ndarray
    pp_pair_s: np.ndarray


class CostModel(Protocol):
    """Scores an (S, R) assignment of device indices; knows nothing of search."""

    name: str
    stages: int
    replicas: int
    n_devices: int

    def evaluate(self, assignment: np.ndarray) -> CostBreakdown:
        """Full breakdown of one valid assignment."""
        ...

    def evaluate_many(self, assignments: np.ndarray) -> np.ndarray:
        """Totals (seconds) of a (B, S, R) batch of valid assignments."""
        ...

    def pairwise_terms(self) -> PairwiseTerms | None:
        """The pairwise form if the model has one (enables fast incremental search), else None."""
        ...
