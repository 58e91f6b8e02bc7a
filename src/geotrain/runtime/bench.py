"""`geotrain bench runtime`: does the placement the cost model prefers really train faster?

On an emulated, scaled-down geo cluster (two regions, fast links inside, slow links between) three
plans of the same job run one after another in one invocation, through the same launcher:
  planned  - the plan of `geotrain plan`'s default method (`auto`: the exact optimum where it
             applies), scored with this job's real payload bytes;
  random   - a typical random plan: the median-cost one of 201 seeded uniformly random assignments;
  crossing - the worst region-crossing plan: slot (stage s, replica r) in region (s + r) mod G, so
             every pipeline cut and every DP group crosses regions.
Each gives measured iteration time, measured and predicted communication, and the iteration time every
model of predict.ITERATION_MODELS predicts (`cost_model` picks the headline one); ratios are to `planned`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from geotrain.cluster import Cluster, make_network
from geotrain.cost import YuanCostModel
from geotrain.errors import GeotrainError
from geotrain.codecs import parse_codec_spec
from geotrain.models import TINY_GPT, GPTConfig
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.launcher import launch
from geotrain.runtime.predict import ITERATION_MODELS, measured_traffic
from geotrain.runtime.report import RunReport
from geotrain.runtime.stages import build_stage
from geotrain.search import SEARCH_METHODS, PlacementProblem, run_search


class RuntimeBenchError(GeotrainError, ValueError):
    """A bench option that cannot make a valid layout."""


@dataclass(frozen=True)
class RuntimeBenchConfig:
    """The emulated cluster (Gbit/s, ms), the job and the run length. Defaults: 2 regions x 4 devices,
    2 stages x 4 replicas, 5 Mbit/s and 40 ms between regions (the tiny GPT moves ~1000x fewer bytes
    than the seed's 1.3B job, so its links are slowed alike to keep the geo balance: bandwidth-bound)."""

    devices_per_region: int = 4
    stages: int = 2
    replicas: int = 4
    intra_gbps: float = 10.0
    intra_ms: float = 0.1
    inter_gbps: float = 0.005
    inter_ms: float = 40.0
    time_scale: float = 1.0
    steps: int = 6
    microbatches: int = 4
    batch_size: int = 8
    dp_codec: str = "none"
    pp_codec: str = "none"
    seed: int = 0
    search_methods: tuple[str, ...] = ("auto",)
    search_time_limit_s: float = 10.0
    model: GPTConfig = TINY_GPT
    cost_model: str = ITERATION_MODELS[0]  # the iteration prediction the headline table shows
    run_dir: str | None = None  # each plan's run directory under it (geotrain.observe.run.row_run_dir); None: none

    def __post_init__(self) -> None:
        if self.cost_model not in ITERATION_MODELS:
            raise RuntimeBenchError(f"--cost-model: one of {', '.join(ITERATION_MODELS)}, got {self.cost_model!r}")
        if self.stages * self.replicas != 2 * self.devices_per_region:
            raise RuntimeBenchError(f"stages x replicas ({self.stages} x {self.replicas}) must use all "
                                    f"2 x {self.devices_per_region} devices of the two regions")


@dataclass(frozen=True)
class BenchPlan:
    """One measured plan: its label, how it was chosen, its report."""

    label: str
    chosen_by: str
    report: RunReport


@dataclass(frozen=True)
class RuntimeBench:
    config: RuntimeBenchConfig
    cluster: Cluster
    plans: tuple[BenchPlan, ...]
    expected_dp_bytes: tuple[int, ...]
    expected_pp_bytes: int

    def ratio(self, label: str, key: str = "iteration_s") -> float:
        """plan `label`'s summary[key] / the planned plan's."""
        by_label = {plan.label: plan.report.summary() for plan in self.plans}
        return by_label[label][key] / by_label["planned"][key]

    def to_json(self) -> dict[str, Any]:
        config = {k: v for k, v in asdict(self.config).items() if k != "model"}
        return {"config": config, "cluster": self.cluster.name,
                "plans": [{"label": p.label, "chosen_by": p.chosen_by, **p.report.to_json()} for p in self.plans],
                "ratios": {p.label: {"iteration": self.ratio(p.label),
                                     "comm_measured": self.ratio(p.label, "comm_measured_s"),
                                     "comm_predicted": self.ratio(p.label, "comm_predicted_s")} for p in self.plans},
                "expected_bytes": {"dp_per_stage": list(self.expected_dp_bytes), "pp_per_cut": self.expected_pp_bytes}}


def bench_cluster(config: RuntimeBenchConfig) -> Cluster:
    d = config.devices_per_region
    return make_network([d, d], config.intra_gbps, (config.inter_gbps, config.inter_gbps),
                        (config.inter_ms, config.inter_ms), seed=config.seed, intra_ms=config.intra_ms,
                        name=f"geo-2x{d}-{config.inter_gbps * 1e3:g}mbps-{config.inter_ms:g}ms")


def payload_bytes(config: RuntimeBenchConfig) -> tuple[tuple[int, ...], int]:
    """(DP gradient payload bytes per stage, activation payload bytes per replica per cut per
    iteration) of this job, from the stages' parameter counts and the codecs' wire sizes."""
    from geotrain.codecs import get_codec

    dp_codec = get_codec(*_spec(config.dp_codec))
    pp_codec = get_codec(*_spec(config.pp_codec))
    dp = tuple(dp_codec.wire_nbytes((sum(p.numel() for p in build_stage(config.model, 0, s, config.stages).parameters()),))
               for s in range(config.stages))
    micro = config.batch_size // config.microbatches
    pp = pp_codec.wire_nbytes((micro, config.model.context, config.model.d_model)) * config.microbatches
    return dp, (pp if config.stages > 1 else 0)


def _spec(spec: str) -> tuple[str]:
    name, params = parse_codec_spec(spec)
    if params:
        raise RuntimeBenchError(f"bench codecs take no parameters here, got {spec!r}")
    return (name,)


def _problem(cluster: Cluster, config: RuntimeBenchConfig, dp_bytes: tuple[int, ...], pp_bytes: int) -> PlacementProblem:
    """The placement problem scored with this job's real payload bytes (mean DP bytes of the stages)."""
    traffic = measured_traffic([float(np.mean(dp_bytes))] * config.stages, pp_bytes, config.replicas)
    return PlacementProblem(cluster, YuanCostModel(cluster, traffic))


def planned_assignment(problem: PlacementProblem, config: RuntimeBenchConfig) -> tuple[np.ndarray, str]:
    """The lowest-cost plan of the registered methods among config.search_methods, and its method."""
    methods = [name for name in config.search_methods if name in SEARCH_METHODS]
    if not methods:
        raise RuntimeBenchError(f"none of the search methods {list(config.search_methods)} is registered "
                                f"(registered: {', '.join(sorted(SEARCH_METHODS))})")
    results = [run_search(name, problem, seed=config.seed, time_limit_s=config.search_time_limit_s)
               for name in methods]
    best = min(results, key=lambda result: result.cost.total)
    return np.asarray(best.assignment), best.method


def median_random_assignment(problem: PlacementProblem, seed: int, samples: int = 201) -> np.ndarray:
    """Of `samples` uniformly random assignments (seeded), the one of median predicted cost."""
    rng = np.random.default_rng(seed)
    orders = np.argsort(rng.random((samples, problem.n_devices)), axis=1)
    candidates = orders[:, : problem.stages * problem.replicas].reshape(samples, problem.stages, problem.replicas)
    totals = problem.cost_model.evaluate_many(candidates)
    return candidates[int(np.argsort(totals, kind="stable")[samples // 2])]


def region_crossing_assignment(cluster: Cluster, stages: int, replicas: int) -> np.ndarray:
    """Slot (s, r) on the next free device of region (s + r) mod G: every cut and DP group crosses."""
    free = {g: list(cluster.devices_in_region(g)) for g in range(cluster.n_regions)}
    assignment = np.zeros((stages, replicas), dtype=np.int64)
    for s in range(stages):
        for r in range(replicas):
            region = (s + r) % cluster.n_regions
            if not free[region]:
                raise RuntimeBenchError(f"region {region} has too few devices for a crossing plan")
            assignment[s, r] = free[region].pop(0)
    return assignment


def run_runtime_bench(config: RuntimeBenchConfig, progress: Callable[[str, int, int], None] | None = None) -> RuntimeBench:
    """Choose the three plans and train each for config.steps steps; `progress(label, done, total)`."""
    from geotrain.data import world_tokens
    from geotrain.observe.run import recording, row_run_dir

    cluster = bench_cluster(config)
    dp_bytes, pp_bytes = payload_bytes(config)
    problem = _problem(cluster, config, dp_bytes, pp_bytes)
    planned, method = planned_assignment(problem, config)
    candidates = [("planned", f"search: {method}", planned),
                  ("random", "median of 201 random plans", median_random_assignment(problem, config.seed)),
                  ("crossing", "every cut and DP group crosses regions",
                   region_crossing_assignment(cluster, config.stages, config.replicas))]
    tokens = world_tokens(0)
    plans = []
    for label, chosen_by, assignment in candidates:
        run_config = RuntimeConfig.of(cluster, assignment, label, gpt=config.model, steps=config.steps,
                                      microbatches=config.microbatches, batch_size=config.batch_size,
                                      dp_codec=config.dp_codec, pp_codec=config.pp_codec, time_scale=config.time_scale,
                                      seed=config.seed,
                                      run_dir=None if config.run_dir is None else row_run_dir(config.run_dir, label))
        callback = None if progress is None else (lambda done, total, label=label: progress(label, done, total))
        with recording(run_config):
            report = launch(run_config, progress=callback, tokens=tokens).report
        plans.append(BenchPlan(label, chosen_by, report))
    return RuntimeBench(config, cluster, tuple(plans), dp_bytes, pp_bytes)
