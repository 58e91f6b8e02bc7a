"""Placement methods over several seeds against the proven optimum (or a proven lower bound).

Every labelled run (method + options) is repeated for each seed on the same problem; the reference
is `exact` when the cluster is region-uniform and the MILP applies, otherwise the best lower bound
(`search.bounds.lower_bound`, given the best total found). Gaps are (total - reference) / total.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from geotrain.cluster import load_cluster
from geotrain.cost import build_cost_model
from geotrain.job import load_job
from geotrain.search import PlacementProblem, ProgressCallback, SearchError, run_search
from geotrain.search.bounds import lower_bound


@dataclass(frozen=True)
class SeededRun:
    label: str
    method: str
    options: dict[str, Any] = field(default_factory=dict)
    seeded: bool = True


DEFAULT_RUNS: tuple[SeededRun, ...] = (
    SeededRun("random (best of 200)", "random", {"samples": 200}),
    SeededRun("pipeline-local", "pipeline-local", seeded=False),
    SeededRun("dp-local", "dp-local", seeded=False),
    SeededRun("local search, strict 5x3000", "local-search", {"iterations": 3000, "restarts": 5, "strict": True}),
    SeededRun("local search, sideways 1x20000", "local-search", {"iterations": 20000, "restarts": 1}),
    SeededRun("local search, sideways 5x20000", "local-search", {"iterations": 20000, "restarts": 5}),
    SeededRun("genetic, random population", "genetic", {"structured_starts": False}),
    SeededRun("genetic", "genetic"),
    SeededRun("hierarchical, random starts", "hierarchical", {"structured_starts": False, "starts": 8}),
    SeededRun("hierarchical", "hierarchical"),
)


@dataclass(frozen=True)
class SeedsBenchConfig:
    cluster: str = "seed-geo"
    job: str = "gpt-1.3b-seed"
    stages: int = 4
    replicas: int = 8
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    time_limit_s: float | None = 60.0
    bound_time_limit_s: float = 60.0
    runs: tuple[SeededRun, ...] = DEFAULT_RUNS


@dataclass(frozen=True)
class SeedsBench:
    """rows: per run label, per seed {"seed", "total_s", "seconds"}; reference: {"kind": "optimum" |
    "lower bound", "total_s", "seconds", "source"}."""

    config: SeedsBenchConfig
    rows: list[dict[str, Any]]
    reference: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "reference": self.reference, "rows": self.rows}


def run_seeds_bench(config: SeedsBenchConfig, progress: ProgressCallback | None = None) -> SeedsBench:
    cluster = load_cluster(config.cluster)
    job = load_job(config.job)
    problem = PlacementProblem(cluster, build_cost_model("yuan", cluster, job, config.stages, config.replicas))
    steps = 1 + sum(len(config.seeds) if run.seeded else 1 for run in config.runs)
    done = 0
    reference: dict[str, Any] | None = None
    try:
        exact = run_search("exact", problem, time_limit_s=config.bound_time_limit_s)
        if exact.details["proven_optimal"]:
            reference = {"kind": "optimum", "total_s": exact.cost.total, "seconds": exact.seconds, "source": "exact"}
    except SearchError:
        pass
    done += 1
    rows: list[dict[str, Any]] = []
    for run in config.runs:
        results = []
        for seed in (config.seeds if run.seeded else config.seeds[:1]):
            result = run_search(run.method, problem, seed=seed, time_limit_s=config.time_limit_s, options=run.options)
            results.append({"seed": seed, "total_s": result.cost.total, "seconds": result.seconds})
            done += 1
            if progress is not None:
                progress(done, steps)
        rows.append({"label": run.label, "method": run.method, "options": run.options, "runs": results})
    if reference is None:
        best = min(r["total_s"] for row in rows for r in row["runs"])
        bound = lower_bound(problem, upper_bound_s=best, time_limit_s=config.bound_time_limit_s)
        reference = {"kind": "lower bound", "total_s": bound.value_s, "seconds": bound.seconds, "source": bound.source}
    for row in rows:
        for r in row["runs"]:
            r["gap"] = max(0.0, (r["total_s"] - reference["total_s"]) / r["total_s"])
    return SeedsBench(config, rows, reference)
