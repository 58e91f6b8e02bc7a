"""`geotrain bench hetero`: heterogeneous sites without lock-step. Time to a target validation loss of bench wan's
GPT on 4 sites whose GPUs differ 4.8x in speed (bench/data/hetero-4x1.yaml: A100, V100, L4, T4 over bench wan's
~100 Mbit/s, 50-150 ms links), each rank computing at its GPU's speed (`emulate_gpu_speed`: measured compute x the
fastest GPU's peak over the device's).

Rows (`DEFAULT_ROWS`, one `HeteroRow` each, by `kind`): the same model, seed, data, global batch and token budget
(`steps` x global batch samples: with adaptive local steps the periods, ceil(steps / H), share R x H inner steps
each), trained through the runtime as bench wan trains (geotrain.bench.wan: its settings, `WanBenchConfig`, and its
checkpoint reader); a row is RuntimeConfig settings, skipped (and listed, with the runtime's reason) where the
runtime refuses them on this bench. Measured:
- time to target: emulated seconds from step 0 to the first evaluation at or below the target. Every row scores
  each replica's own weights after each outer period (every step's DP rows at the same cadence), with no
  collective and outside emulated time (`eval_local`); a point's time is the slowest rank's emulated clock at the
  step the point follows (for adaptive rows the step that completed the sync: ranks differ in step counts). The
  asynchronous rows have no common point: each rank scores the global model it gets back after each of its outer
  updates, and a row's points are, as one per period, the first global model holding each multiple of R updates
  (`async_points`), at that model's time: when its server sent it (sync.async_timing's emulated clock; the rank
  receiving it holds it one link later);
- val_loss: replica 0's at the run's end (synchronised weights), the same samples seen by every row;
- site_compute_fraction: per site (region), its compute seconds (the runtime's ComputeTimer, at the GPU's speed)
  over the row's emulated seconds;
- inter_region_bytes: payload bytes the emulator carried between regions (bench wan's measure);
- predicted_step_s, predicted_site_compute_fraction: the planner's, for every row whose settings it prices, from
  the limit row's measured compute per step (geotrain.bench.hetero_predict); the `recipe` row runs what the planner
  chooses from that compute (`geotrain plan --wan-recipe auto`: equal or adaptive local steps, H, P, tau, codec, by
  predicted time to target with the limit row's steps to the target as T0), after the limit row;
  predicted_time_to_target_s: the recipe row's (cost.convergence).
The `limit` row: zero-cost links (bench.wan_metrics.zero_cost_links) and the work balanced perfectly by speed,
which the emulator cannot run with fixed GPU types, so it is modelled from a DDP run on the free links (its bytes
are that run's, carried at no cost): each step
takes the harmonic mean of the ranks' compute seconds (each site's share of the batch in proportion to its
speed, so all finish together) plus what the run spent outside compute (free links: next to nothing); every site
then computes that same fraction of the time.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geotrain.bench.hetero_predict import site_names
from geotrain.bench.wan_metrics import step_bounds, zero_cost_links
from geotrain.bench.wan_rows import BENCH_CLUSTERS, WanBenchConfig, WanBenchError
from geotrain.cluster import Cluster, load_cluster

HETERO_CLUSTER_NAME = "hetero-4x1"  # bench hetero's default --cluster, as a user types it (bench_cluster finds it)
HETERO_CLUSTER = str(BENCH_CLUSTERS / f"{HETERO_CLUSTER_NAME}.yaml")
KINDS = ("ddp-equal", "ddp-speed", "diloco-equal", "diloco-adaptive", "async", "async-hierarchical", "recipe", "limit")
"""The row kinds of the JSON contract; this geotrain runs those of DEFAULT_ROWS whose settings it has."""
SYNC_EVERY = 5
OUTER_AVERAGE = (("sync_every", SYNC_EVERY), ("outer_lr", 1.0), ("outer_momentum", 0.0), ("dp_codec", "int8-block"))
"""DiLoCo rows: parameters averaged every H = 5 steps (outer lr 1, no momentum), the deltas sent int8-block with
error feedback (bench wan's fastest blocking row, "local SGD H=5 + int8-block+EF outer"): compute, not the
links, then sets most of a period, which is where the sites' speeds matter. diloco-equal blocks: with equal steps an
overlapped sync reached the target later on this bench (its stale steps cost more than the link time it hides)."""
ADAPTIVE_DELAY = 2
ADAPTIVE_OVERLAP = (("local_steps", "adaptive"), ("sync_delay", ADAPTIVE_DELAY), ("sync_landing", "eager"))
"""The adaptive row: H_r by speed, each sync's exchange overlapped with the next period (it lands after 2/5 of every
replica's period, eagerly; geotrain.sync.adaptive). Blocking, it computed ~70% of the time (the int8 exchange is
~0.4 s of a ~1.2 s period); tau 1 hides less of it on the fast site, tau 3 gains nothing more."""


@dataclass(frozen=True)
class HeteroRow:
    """One way to train: a `kind` of KINDS, a label and RuntimeConfig settings; `limit`: the modelled limit row."""

    kind: str
    label: str
    options: tuple[tuple[str, Any], ...] = ()
    limit: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise WanBenchError(f"bench hetero row {self.label!r}: kind must be one of {', '.join(KINDS)}, "
                                f"got {self.kind!r}")

    @property
    def sync_every(self) -> int:
        return int(dict(self.options).get("sync_every") or 1)


DEFAULT_ROWS: tuple[HeteroRow, ...] = (
    HeteroRow("ddp-equal", "DDP, equal batches (fp32)"),
    HeteroRow("ddp-speed", "DDP, batch shares by GPU speed (fp32)", (("batch_shares", "speed"),)),
    HeteroRow("diloco-equal", f"DiLoCo H={SYNC_EVERY} (outer avg, int8-block+EF), equal local steps", OUTER_AVERAGE),
    HeteroRow("diloco-adaptive", f"DiLoCo H={SYNC_EVERY} (outer avg, int8-block+EF), adaptive local steps, "
              f"overlapped (tau {ADAPTIVE_DELAY}, eager)", (*OUTER_AVERAGE, *ADAPTIVE_OVERLAP)),
    HeteroRow("async", f"DiLoCo H={SYNC_EVERY}, asynchronous outer updates (full weight when stale)",
              (*OUTER_AVERAGE, ("outer_sync", "async"))),
    HeteroRow("async-hierarchical", f"DiLoCo H={SYNC_EVERY}, asynchronous, merged per region first (full weight "
              f"when stale)", (*OUTER_AVERAGE, ("outer_sync", "async-hierarchical"))),
    HeteroRow("recipe", "planner's WAN recipe (auto: local steps, H, P, tau, outer codec)"),
    HeteroRow("limit", "limit: zero-cost links, work balanced by speed (modelled)", limit=True),
)
"""The rows run by default; those whose settings this geotrain lacks are skipped and listed. The `recipe` row's
settings are the planner's (bench.hetero_predict.plan_recipe), chosen after the limit row has run. The asynchronous
rows run the runtime's defaults: a stale update at full weight (--async-staleness-power 0) and each rank's learning
rate at the run's progress (docs/history/async-staleness.md: 0.87 -> 0.63 nats at 1000 steps)."""


def hetero_config(**overrides: Any) -> WanBenchConfig:
    """bench wan's settings with the hetero cluster, 60 steps, evaluation every H steps and target 2.5."""
    settings: dict[str, Any] = {"cluster": HETERO_CLUSTER_NAME, "steps": 60, "eval_every": SYNC_EVERY, "target": 2.5,
                                "rows": ()}
    return WanBenchConfig(**{**settings, **overrides})


@dataclass(frozen=True)
class HeteroResult:
    """A trained row: evaluation points (emulated seconds, validation loss), final loss, traffic, compute."""

    row: HeteroRow
    eval_time_s: list[float]
    val_losses: list[float]
    val_loss: float
    inter_region_bytes: float
    site_compute_fraction: dict[str, float]
    elapsed_s: float
    inner_steps: dict[str, int]
    predicted_step_s: float | None = None
    predicted_site_compute_fraction: dict[str, float] | None = None
    recipe: dict[str, Any] | None = None  # the recipe row: the plan's "wan_recipe" (cost.wan_recipe.WanRecipe)

    def time_to_target(self, target: float) -> float | None:
        return next((t for t, loss in zip(self.eval_time_s, self.val_losses) if loss <= target), None)


@dataclass(frozen=True)
class HeteroBench:
    config: WanBenchConfig
    cluster: Cluster
    results: tuple[HeteroResult, ...]
    skipped: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        rows = [{"kind": r.row.kind, "label": r.row.label, "time_to_target_s": r.time_to_target(self.config.target),
                 "val_loss": r.val_loss, "site_compute_fraction": r.site_compute_fraction,
                 "inter_region_bytes": r.inter_region_bytes, "predicted_step_s": r.predicted_step_s,
                 "measured_step_s": r.elapsed_s / self.config.steps,
                 "predicted_site_compute_fraction": r.predicted_site_compute_fraction, "recipe": r.recipe,
                 "predicted_time_to_target_s": (r.recipe or {}).get("convergence", {}).get("time_to_target_s"),
                 "elapsed_s": r.elapsed_s, "inner_steps": r.inner_steps, "options": dict(r.row.options),
                 "curve": {"time_s": r.eval_time_s, "val_loss": r.val_losses}} for r in self.results]
        config = {k: v for k, v in self.config.__dict__.items() if k != "rows"}
        return {"rows": rows, "target": self.config.target, "cluster": self.cluster.name, "config": config,
                "gpus": dict(zip(site_names(self.cluster), self.cluster.gpus, strict=True)),
                "skipped": [{"kind": kind, "reason": reason} for kind, reason in self.skipped]}


def _unavailable(row: HeteroRow, cluster: Cluster, config: WanBenchConfig) -> str | None:
    """Why `row` cannot run here (a setting this geotrain lacks, or one its runtime refuses on this bench), else
    None."""
    from geotrain.runtime import RuntimeConfigError
    from geotrain.runtime.config import setting_keys

    missing = [key for key, _ in row.options if key not in setting_keys()]
    if missing:
        return f"RuntimeConfig has no setting {', '.join(missing)} in this geotrain"
    try:
        row_config(row, cluster, config, None)
    except RuntimeConfigError as exc:
        return str(exc)
    return None


def row_config(row: HeteroRow, cluster: Cluster, config: WanBenchConfig, directory: str | None) -> Any:
    """The RuntimeConfig that trains `row` on `cluster`: one replica per device, compute at each GPU's speed, each
    replica scoring its own weights every `eval_every` steps or outer periods, checkpoints in `directory`."""
    from geotrain.bench.wan import _preset
    from geotrain.observe.run import row_run_dir
    from geotrain.runtime import RuntimeConfig

    replicas = cluster.n_devices
    assignment = np.arange(replicas, dtype=np.int64).reshape(1, -1)
    return RuntimeConfig.of(cluster, assignment, row.label, steps=config.steps, microbatches=config.microbatches,
                            batch_size=config.global_batch // replicas, lr=config.lr,
                            time_scale=config.time_scale, seed=config.seed, checkpoint_dir=directory,
                            checkpoint_every=0, compute_clock=config.compute_clock, emulate_gpu_speed=True,
                            gpt=_preset(config.model), model_name=config.model,
                            eval_every=math.lcm(config.eval_every, row.sync_every), eval_local=True,
                            eval_windows=config.val_windows,
                            run_dir=None if config.run_dir is None else row_run_dir(config.run_dir, row.kind),
                            **dict(row.options))


def train_row(row: HeteroRow, cluster: Cluster, config: WanBenchConfig, tokens: Any,
              progress: Callable[[int, int], None] | None = None) -> tuple[list[dict[str, Any]], float]:
    """Train `row` on `cluster` (one replica per device, compute at each GPU's speed, each replica scoring its own
    weights every `eval_every` steps or outer periods); every rank's records and replica 0's final loss."""
    from geotrain.bench.wan import _evaluate
    from geotrain.observe.run import recording
    from geotrain.runtime import launch

    with tempfile.TemporaryDirectory(prefix="geotrain-hetero-") as directory:
        run = row_config(row, cluster, config, directory)
        with recording(run):
            launch(run, progress=progress, tokens=tokens)
        loss, records = _evaluate(directory, config.steps, run, config, tokens)
    return records, loss


def _point(record: dict[str, Any]) -> int:
    """Which evaluation point a record's step ends: its outer sync (adaptive local steps), else its step."""
    return int(record["outer_step"]) if "outer_step" in record else int(record["step"])


def score(row: HeteroRow, cluster: Cluster, records: list[dict[str, Any]], final_loss: float) -> HeteroResult:
    """Times of the evaluation points, site compute fractions and traffic of a trained row (module doc)."""
    start = min(r["emulated"]["start_s"] for r in records if r["step"] == 0)
    asynchronous = any("global_updates" in r for r in records)  # the global model after each R updates
    points = async_points(records, cluster.n_devices, start) if asynchronous else sync_points(records, start)
    elapsed = max(r["emulated"]["end_s"] for r in records) - start
    compute: dict[int, float] = defaultdict(float)
    steps: dict[int, int] = defaultdict(int)
    for record in records:
        compute[record["rank"]] += record["compute_s"]
        steps[record["rank"]] += 1
    site = {rank: cluster.site_of(rank) for rank in compute}  # one device per rank
    return HeteroResult(row, [t for t, _ in points], [loss for _, loss in points], final_loss,
                        float(sum(r["emulated"]["inter_region_bytes"] for r in records)),
                        {site[rank]: min(1.0, c / elapsed) for rank, c in sorted(compute.items())}, elapsed,
                        {site[rank]: n for rank, n in sorted(steps.items())})


def sync_points(records: list[dict[str, Any]], start: float) -> list[tuple[float, float]]:
    """A synchronous row's evaluation points (time since `start`, replica 0's loss), one per step or outer sync
    scored: at the slowest rank's clock at the end of the step the point follows (module doc)."""
    ends: dict[int, float] = defaultdict(float)
    losses: dict[int, float] = {}
    for record in records:
        if record.get("val_loss") is not None:
            key = _point(record)
            ends[key] = max(ends[key], record["emulated"]["end_s"] - start)
            if record["rank"] == 0:
                losses[key] = float(record["val_loss"])
    return [(ends[key], losses[key]) for key in sorted(losses)]


def async_points(records: list[dict[str, Any]], replicas: int, start: float) -> list[tuple[float, float]]:
    """An asynchronous row's evaluation points (time since `start`, loss), one per R replica updates as a synchronous
    row has one per period: for k = 1, 2, ... the first global model holding at least k x R updates that a rank
    scored (each rank scores the model it gets back after each of its updates), at that model's time (when its
    server sent it), then the final model."""
    scored = sorted((int(r["global_updates"]), float(r["global_time_s"]) - start, float(r["val_loss"]))
                    for r in records if r.get("val_loss") is not None)
    points: list[tuple[float, float]] = []
    due = replicas
    for updates, time_s, loss in scored:
        if updates >= due:
            points.append((time_s, loss))
            due = (updates // replicas + 1) * replicas
    if scored and (not points or points[-1] != (scored[-1][1], scored[-1][2])):
        points.append((scored[-1][1], scored[-1][2]))  # the final model (the last version: every rank scores it)
    return sorted(points)


def balanced_limit(row: HeteroRow, cluster: Cluster, records: list[dict[str, Any]], final_loss: float,
                   steps: int) -> HeteroResult:
    """The limit row from a DDP run on free links (module doc): per step the harmonic mean of the ranks' compute
    seconds plus the step's time outside the slowest rank's compute."""
    begin, end = step_bounds(records, steps)
    compute = np.zeros((steps, cluster.n_devices))
    for record in records:
        compute[record["step"], record["rank"]] = record["compute_s"]
    balanced_compute = compute.shape[1] / np.sum(1.0 / compute, axis=1)
    balanced = balanced_compute + np.maximum(0.0, (end - begin) - compute.max(axis=1))
    elapsed = np.cumsum(balanced)
    points = sorted({r["step"]: float(r["val_loss"]) for r in records
                     if r["rank"] == 0 and r.get("val_loss") is not None}.items())
    fraction = float(balanced_compute.sum() / elapsed[-1])
    sites = site_names(cluster)
    nbytes = float(sum(r["emulated"]["inter_region_bytes"] for r in records))  # carried, at no cost
    return HeteroResult(row, [float(elapsed[s]) for s, _ in points], [loss for _, loss in points], final_loss, nbytes,
                        {name: fraction for name in sites}, float(elapsed[-1]), {name: steps for name in sites})


def run_hetero_bench(config: WanBenchConfig, rows: tuple[HeteroRow, ...] = DEFAULT_ROWS,
                     progress: Callable[[str, int, int], None] | None = None) -> HeteroBench:
    """Train every row this geotrain can run (the others are listed as skipped); `progress(label, done, total)`."""
    from geotrain.bench.wan import bench_cluster
    from geotrain.data import world_tokens

    cluster = load_cluster(bench_cluster(config.cluster))
    if config.global_batch % (cluster.n_devices * config.microbatches):
        raise WanBenchError(f"bench hetero needs a global batch divisible by {cluster.n_devices} devices x "
                            f"{config.microbatches} micro-batches, got {config.global_batch}")
    tokens = world_tokens(0)
    results: list[HeteroResult | HeteroRow] = []
    skipped, limit_records = [], []
    for row in rows:
        reason = _unavailable(row, zero_cost_links(cluster) if row.limit else cluster, config)
        if reason is not None:
            skipped.append((row.kind, reason))
            continue
        if row.kind == "recipe":  # planned and run after the limit row, whose compute the planner needs
            results.append(row)
            continue
        records, loss = _train(row, zero_cost_links(cluster) if row.limit else cluster, config, tokens, progress)
        if row.limit:
            limit_records = records
        results.append(balanced_limit(row, cluster, records, loss, config.steps) if row.limit
                       else score(row, cluster, records, loss))
    if not limit_records:
        return HeteroBench(config, cluster, tuple(r for r in results if isinstance(r, HeteroResult)), tuple(skipped))
    return HeteroBench(config, cluster, tuple(_with_predictions(results, cluster, config, tokens, limit_records,
                                                                progress)), tuple(skipped))


def _train(row: HeteroRow, cluster: Cluster, config: WanBenchConfig, tokens: Any,
           progress: Callable[[str, int, int], None] | None) -> tuple[list[dict[str, Any]], float]:
    callback = None if progress is None else (lambda done, total, label=row.label: progress(label, done, total))
    return train_row(row, cluster, config, tokens, callback)


def _with_predictions(results: list[HeteroResult | HeteroRow], cluster: Cluster, config: WanBenchConfig, tokens: Any,
                      limit_records: list[dict[str, Any]],
                      progress: Callable[[str, int, int], None] | None) -> list[HeteroResult]:
    """Run the recipe rows (planned from the limit row's measured compute) and attach the planner's predictions
    to every row it prices (bench.hetero_predict)."""
    from geotrain.bench.hetero_predict import (codec_seconds, measured_compute_s, plan_recipe, predict_row,
                                               target_steps_of)
    from geotrain.bench.wan import model_job

    job = model_job(config.global_batch, config.model)
    compute = measured_compute_s(limit_records, cluster.n_devices)
    codec_s = codec_seconds(cluster)
    done: list[HeteroResult] = []
    for item in results:
        if isinstance(item, HeteroRow):  # the recipe row: the plan's settings, its prediction
            recipe = plan_recipe(cluster, job, compute, config.steps, codec_s,
                                 target_steps_of(limit_records, config.target))
            row = dataclasses.replace(item, options=(*recipe.runtime_settings()["optim"].items(),
                                                     ("dp_codec", recipe.codec)))
            records, loss = _train(row, cluster, config, tokens, progress)
            fractions = dict(zip(site_names(cluster), recipe.replica_compute_fraction or ()))
            done.append(dataclasses.replace(score(row, cluster, records, loss), predicted_step_s=recipe.step_s,
                                            predicted_site_compute_fraction=fractions, recipe=recipe.to_json()))
            continue
        prediction = None if item.row.limit else predict_row(dict(item.row.options), cluster, job, compute, codec_s,
                                                             config.global_batch // cluster.n_devices,
                                                             config.microbatches)
        done.append(item if prediction is None else dataclasses.replace(
            item, predicted_step_s=prediction.step_s, predicted_site_compute_fraction=prediction.site_compute_fraction))
    return done


def with_rows(kinds: str | None) -> tuple[HeteroRow, ...]:
    """DEFAULT_ROWS, or those of the comma-separated `kinds` (the limit row always)."""
    if not kinds:
        return DEFAULT_ROWS
    wanted = {k.strip() for k in kinds.split(",")} | {"limit"}
    unknown = wanted - set(KINDS)
    if unknown:
        raise WanBenchError(f"--rows: kinds among {', '.join(KINDS)}, got {', '.join(sorted(unknown))}")
    return tuple(row for row in DEFAULT_ROWS if row.kind in wanted)


__all__ = ["DEFAULT_ROWS", "HETERO_CLUSTER", "HETERO_CLUSTER_NAME", "KINDS", "HeteroBench", "HeteroResult",
           "HeteroRow", "async_points", "balanced_limit", "hetero_config", "row_config", "run_hetero_bench", "score",
           "train_row", "with_rows"]
