"""Placement-search benchmark: quality and time of every method, and swap-evaluation speed.

`method_rows` runs each search on one problem (total cost, gap to the best found, wall seconds,
evaluations). `swap_speed` walks the same pre-drawn swaps from the same start three ways, side by
side in one process: the incremental numba kernel, the compiled full recompute, and the full
`evaluate_many` call per swap that local search falls back to without pairwise terms. Timings are
best of `repeats` (the machine may be shared); ratios are what to compare across machines.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from geotrain.cluster import load_cluster
from geotrain.cost import build_cost_model
from geotrain.job import load_job
from geotrain.search import SEARCH_METHODS, PlacementProblem, ProgressCallback, run_search
from geotrain.search.incremental import ACCEPT_SIDEWAYS, REL_TOL, draw_swaps, init_state, swap_search, swap_search_full
from geotrain.search.local_search import improve, walk_full_recompute


@dataclass(frozen=True)
class BenchRun:
    """One row: a label, a registered method and its options."""

    label: str
    method: str
    options: dict[str, Any] = field(default_factory=dict)


SEED_RUNS: tuple[BenchRun, ...] = (
    BenchRun("random (200)", "random", {"samples": 200}),
    BenchRun("pipeline-local", "pipeline-local"),
    BenchRun("dp-local", "dp-local"),
    BenchRun("strict LS 5x3000", "local-search", {"iterations": 3000, "restarts": 5, "strict": True}),
    BenchRun("sideways LS 5x20000", "local-search", {"iterations": 20000, "restarts": 5}),
)


def default_runs(methods: tuple[str, ...] | None = None) -> list[BenchRun]:
    """The seed's runs, then every other registered method with its default options; `methods`
    keeps only runs of those methods."""
    runs = list(SEED_RUNS)
    covered = {run.method for run in runs}
    runs += [BenchRun(name, name) for name in SEARCH_METHODS if name not in covered]
    return [run for run in runs if methods is None or run.method in methods]


@dataclass(frozen=True)
class PlanBenchConfig:
    cluster: str = "seed-geo"
    job: str = "gpt-1.3b-seed"
    cost_model: str = "yuan"
    stages: int = 4
    replicas: int = 8
    seed: int = 0
    time_limit_s: float | None = 120.0
    methods: tuple[str, ...] | None = None
    incremental_swaps: int = 400_000
    compiled_full_swaps: int = 100_000
    numpy_full_swaps: int = 4_000
    repeats: int = 3


def method_rows(problem: PlacementProblem, runs: list[BenchRun], seed: int, time_limit_s: float | None,
                progress: ProgressCallback | None = None) -> list[dict[str, Any]]:
    """Run each search; rows with total (s), gap to the best total found, wall seconds and evaluations."""
    rows = []
    for k, run in enumerate(runs):
        result = run_search(run.method, problem, seed=seed, time_limit_s=time_limit_s, options=run.options)
        rows.append({"label": run.label, "method": run.method, "options": run.options, "total_s": result.cost.total,
                     "dp_s": result.cost.dp, "pp_s": result.cost.pp, "wall_s": result.seconds,
                     "evaluations": result.evaluations, "lower_bound": result.lower_bound})
        if progress is not None:
            progress(k + 1, len(runs))
    best = min(row["total_s"] for row in rows)
    for row in rows:
        row["gap"] = row["total_s"] / best - 1.0
    return rows


def _best_time(run, repeats: int) -> tuple[float, Any]:
    best, value = np.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        value = run()
        best = min(best, time.perf_counter() - start)
    return best, value


def swap_speed(problem: PlacementProblem, seed: int, incremental_swaps: int, compiled_full_swaps: int,
               numpy_full_swaps: int, repeats: int = 3) -> dict[str, Any]:
    """Swap evaluations per second of the three evaluators on the same sideways walk."""
    model = problem.cost_model
    terms = model.pairwise_terms()
    if terms is None:
        raise ValueError(f"cost model {model.name!r} has no pairwise terms: no incremental evaluation to measure")
    S, R, N = problem.stages, problem.replicas, problem.n_devices
    dp_pair, pp_pair = np.ascontiguousarray(terms.dp_pair_s), np.ascontiguousarray(terms.pp_pair_s)
    rng = np.random.default_rng(seed)
    start_order = rng.permutation(N).astype(np.int64)
    first, second = draw_swaps(rng, max(incremental_swaps, compiled_full_swaps, numpy_full_swaps), S * R, N)

    def incremental(count: int) -> tuple[int, float]:
        order = start_order.copy()
        rowsum, dp_stage, pp_rep = init_state(dp_pair, pp_pair, order, S, R)
        accepted = swap_search(dp_pair, pp_pair, S, R, order, rowsum, dp_stage, pp_rep, first[:count],
                               second[:count], ACCEPT_SIDEWAYS, REL_TOL, np.empty(0))
        return accepted, float(dp_stage.max() + pp_rep.max())

    def compiled_full(count: int) -> tuple[int, float]:
        return swap_search_full(dp_pair, pp_pair, S, R, start_order.copy(), first[:count], second[:count],
                                ACCEPT_SIDEWAYS, REL_TOL)

    def numpy_full(count: int) -> tuple[int, float]:
        return walk_full_recompute(model, start_order.copy(), first[:count], second[:count], ACCEPT_SIDEWAYS)

    incremental(16)  # compile (or load the numba cache) before timing
    compiled_full(16)
    t_inc, (acc_inc, total_inc) = _best_time(lambda: incremental(incremental_swaps), repeats)
    t_full, (acc_full, total_full) = _best_time(lambda: compiled_full(compiled_full_swaps), repeats)
    t_np, (acc_np, total_np) = _best_time(lambda: numpy_full(numpy_full_swaps), max(1, repeats - 1))
    # the same walk, checked: same accepted count and end total over a common prefix
    check_inc = incremental(numpy_full_swaps)
    rates = {"incremental": incremental_swaps / t_inc, "compiled_full": compiled_full_swaps / t_full,
             "numpy_full": numpy_full_swaps / t_np}
    return {
        "devices": N, "stages": S, "replicas": R,
        "swaps": {"incremental": incremental_swaps, "compiled_full": compiled_full_swaps, "numpy_full": numpy_full_swaps},
        "seconds": {"incremental": t_inc, "compiled_full": t_full, "numpy_full": t_np},
        "evals_per_s": rates,
        "speedup_vs_numpy_full": rates["incremental"] / rates["numpy_full"],
        "speedup_vs_compiled_full": rates["incremental"] / rates["compiled_full"],
        "walks_agree": bool(check_inc[0] == acc_np and abs(check_inc[1] - total_np) <= 1e-9 * total_np),
        "accepted": {"incremental": acc_inc, "compiled_full": acc_full, "numpy_full": acc_np},
    }


@dataclass(frozen=True)
class PlanBench:
    config: PlanBenchConfig
    rows: list[dict[str, Any]]
    swap_speed: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_plan_bench(config: PlanBenchConfig = PlanBenchConfig(), progress: ProgressCallback | None = None) -> PlanBench:
    cluster, job = load_cluster(config.cluster), load_job(config.job)
    problem = PlacementProblem(cluster, build_cost_model(config.cost_model, cluster, job, config.stages, config.replicas))
    if problem.cost_model.pairwise_terms() is not None:  # load the numba kernels before anything is timed
        improve(problem.cost_model, np.arange(config.stages * config.replicas).reshape(config.stages, config.replicas), 16)
    rows = method_rows(problem, default_runs(config.methods), config.seed, config.time_limit_s, progress)
    speed = swap_speed(problem, config.seed, config.incremental_swaps, config.compiled_full_swaps,
                       config.numpy_full_swaps, config.repeats)
    return PlanBench(config=config, rows=rows, swap_speed=speed)
