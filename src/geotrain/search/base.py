"""The contract every placement search method follows.

A method receives a PlacementProblem (cluster + cost model), a typed config, a seed, an optional
time limit and an optional progress callback, and returns a SearchResult. Same seed, same result.
Methods never print: they report progress through the callback and return data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost import CostBreakdown, CostModel
from geotrain.errors import GeotrainError

ProgressCallback = Callable[[float, float], None]
"""Called as progress(done, total) in method-defined units (swaps, generations, seconds...)."""
PlanCallback = Callable[["SearchResult"], None]
"""Told each better plan a search finds, as it finds it (`run_search(on_plan=...)`)."""


class SearchError(GeotrainError, ValueError):
    """A search method, option or problem is invalid."""


@dataclass(frozen=True)
class PlacementProblem:
    """What to place: S x R slots of `cost_model` onto the devices of `cluster`."""

    cluster: Cluster
    cost_model: CostModel

    @property
    def stages(self) -> int:
        return self.cost_model.stages

    @property
    def replicas(self) -> int:
        return self.cost_model.replicas

    @property
    def n_devices(self) -> int:
        return self.cluster.n_devices


@dataclass(frozen=True)
class SearchResult:
    """The best assignment found and how it was found.

    `evaluations`: cost evaluations (full or incremental) performed. `details`: JSON-able,
    method-specific facts (per-restart costs, random mean...). `lower_bound`: a proven bound on the
    optimum total in seconds, when the method has one.
    """

    method: str
    assignment: np.ndarray
    cost: CostBreakdown
    seconds: float
    evaluations: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    lower_bound: float | None = None

    @property
    def proven_optimal(self) -> bool:
        """Whether `lower_bound` certifies this plan optimal (`certifies`)."""
        return self.lower_bound is not None and certifies(self.cost.total, self.lower_bound)


def certifies(total_s: float, bound_s: float) -> bool:
    """Whether a lower bound of `bound_s` proves a plan of `total_s` optimal (equal to 1e-9 relative)."""
    return total_s <= bound_s * (1 + 1e-9)


class SearchRun(Protocol):
    def __call__(
        self,
        problem: PlacementProblem,
        config: Any,
        *,
        seed: int,
        time_limit_s: float | None,
        progress: ProgressCallback | None,
    ) -> SearchResult: ...


@dataclass(frozen=True)
class SearchMethod:
    """A registered method: its name, its config dataclass (all fields defaulted) and its run function."""

    name: str
    config_type: type
    run: SearchRun
    summary: str
    reports_plans: bool = False
    """`run` takes `on_plan` (a PlanCallback) and reports each better plan while it searches."""

    def make_config(self, options: dict[str, Any] | None = None) -> Any:
        """Build the config from `options`, rejecting unknown names."""
        options = dict(options or {})
        known = {f.name for f in fields(self.config_type)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise SearchError(f"method {self.name!r} has no option {unknown[0]!r} (options: {', '.join(sorted(known)) or 'none'})")
        return self.config_type(**options)
