"""`geotrain bench wan`: time to a target validation loss of a small GPT (`--model`: the tiny preset by
default, or "small") on an emulated slow WAN.

Every row trains the same model (seed), on the same data and global batch, for the same step budget,
through the runtime (`geotrain train`'s launcher, one process per slot) over the emulating backend,
and differs only in placement and codecs (`DEFAULT_ROWS`, one line each). Measured:
- emulated wall time: per step, the slowest rank's emulated clock (compute as measured on this CPU,
  links as emulated; geotrain.emulate), summed over steps; the checkpoints this bench writes to
  score validation loss happen between steps and are not counted. Compute is measured in each
  rank's CPU seconds by default (`compute_clock="cpu"`: as if every rank had its own core, so the
  rows do not depend on how loaded this machine is); "wall" counts real elapsed time instead;
- validation loss (nats per character, the world's held-out text) every `eval_every` steps, from
  replica 0's stage checkpoints; time to target = emulated time at the first evaluation at or below
  `target` (None when the budget ends first: the row reports the loss it reached);
- inter-region bytes: payload bytes the emulator carried between devices of different regions,
  all ranks, all steps.
- compute fraction, peak inter-region Gbit/s and the fraction of the limit row's time to target
  (geotrain.bench.wan_metrics). The limit row ("limit" in its label, `free_links`) is the fp32 DDP
  baseline on the cluster with every link free: the same compute, communication free.
Placements: "naive" = data parallelism over every device in index order (the DDP baseline);
"planned" = the layout (stages x replicas) and assignment with the lowest "yuan" cost among the
layouts the tiny GPT allows, searched with the job's real bytes; the planner-codecs row takes the
layout whose cost *with its codec choice* (geotrain.cost.codec_choice) is lowest, and that choice;
a local-SGD row (option `sync_every` H: geotrain.optim.outer) takes the layout whose cost with the DP
term divided by H is lowest, and is evaluated only at steps that end an outer period (synchronised
weights); a delayed-gradients row (sync_delay tau without sync_every: geotrain.sync.delayed) takes the
layout with the lowest pipeline term (its DP exchange travels behind tau steps of compute). The recipe row runs what `geotrain plan --wan-recipe auto` chooses (geotrain.bench.wan_recipe,
after the limit row, whose step time is its compute input); the torchft row runs torchft's DiLoCo
unmodified (geotrain.bench.wan_torchft). Rows, settings and results: geotrain.bench.wan_rows.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from geotrain.cluster import Cluster, load_cluster
from geotrain.cost import YuanCostModel
from geotrain.cost.codec_choice import CodecChoice, choose_codecs, parse_codec_policy
from geotrain.bench.wan_metrics import (compute_fraction, emulated_step_seconds, limit_fraction, peak_profile,
                                        zero_cost_links)
from geotrain.bench.wan_rows import (BENCH_CLUSTERS, DEFAULT_ROWS, LIMIT_ROW, LOCAL_SGD_5, WAN_CLUSTER, RowResult,
                                     WanBenchConfig, WanBenchError, WanRow, bench_cluster)
from geotrain.emulate.traffic import profile_json
from geotrain.job import Job

__all__ = ["BENCH_CLUSTERS", "DEFAULT_ROWS", "LIMIT_ROW", "LOCAL_SGD_5", "WAN_CLUSTER", "PlannedLayout", "RowResult",
           "WanBench", "WanBenchConfig", "WanBenchError", "WanRow", "bench_cluster", "emulated_step_seconds",
           "eval_steps_of", "model_job", "planned_layouts", "run_row", "run_wan_bench", "score_row"]


@dataclass(frozen=True)
class WanBench:
    config: WanBenchConfig
    cluster: Cluster
    results: tuple[RowResult, ...]
    skipped: tuple[tuple[str, str], ...]
    choice: CodecChoice | None = None
    layouts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        base = self.results[0]
        limit = next((r.time_to_target_s for r in self.results if "limit" in r.row.label), None)
        rows = []
        for r in self.results:
            speedup = (base.time_to_target_s / r.time_to_target_s
                       if base.time_to_target_s is not None and r.time_to_target_s else None)
            rows.append({"label": r.row.label, "time_to_target_s": r.time_to_target_s, "speedup": speedup,
                         "inter_region_bytes": r.inter_region_bytes, "val_loss": r.val_loss,
                         "val_loss_fp32_same_steps": base.val_loss, "quality_cost": r.val_loss - base.val_loss,
                         "step_time_s": r.step_time_s, "steps": self.config.steps, "stages": r.stages,
                         "replicas": r.replicas, "assignment": r.assignment, "codecs": r.codecs,
                         "options": dict(r.row.options), "free_links": r.row.free_links, "engine": r.row.engine,
                         "limit_fraction": limit_fraction(r.time_to_target_s, limit),
                         "compute_fraction": r.compute_fraction, "peak_inter_region_gbps": r.peak_inter_region_gbps,
                         "peak_inter_region_gbps_by_window": profile_json(r.peak_profile),
                         "predicted_step_s": r.predicted_step_s, "recipe": r.recipe,
                         "predicted_time_to_target_s": (r.recipe or {}).get("convergence", {}).get("time_to_target_s"),
                         "curve": {"step": r.eval_steps, "time_s": r.eval_time_s, "val_loss": r.val_losses}})
        config = {k: v for k, v in asdict(self.config).items() if k != "rows"}
        return {"rows": rows, "target": self.config.target, "cluster": self.cluster.name, "config": config,
                "skipped": [{"label": label, "reason": reason} for label, reason in self.skipped],
                "planned_layouts": self.layouts,
                "codec_choice": None if self.choice is None else self.choice.to_json()}


def model_job(global_batch: int, model: str = "tiny") -> Job:
    """The GPT preset `model` (geotrain.models.MODEL_PRESETS) as a cost-model Job with its real byte
    counts (fp32 gradients and activations)."""
    from geotrain.runtime.stages import build_stage

    gpt = _preset(model)
    params = sum(p.numel() for p in build_stage(gpt, 0, 0, 1).parameters())
    return Job(name=f"{model}-gpt", params=float(params), seq_len=gpt.context, hidden=gpt.d_model,
               global_batch=global_batch, layers=gpt.n_layer, bytes_per_value=4, vocab=gpt.vocab_size)


def _preset(model: str) -> Any:
    from geotrain.models import MODEL_PRESETS

    if model not in MODEL_PRESETS:
        raise WanBenchError(f"--model: one of {', '.join(MODEL_PRESETS)}, got {model!r}")
    return MODEL_PRESETS[model]


@dataclass(frozen=True)
class PlannedLayout:
    """A layout's searched assignment, its uncompressed "yuan" seconds (total, DP and pipeline terms)
    and its codec choice."""

    assignment: np.ndarray
    cost_s: float
    choice: CodecChoice
    dp_s: float = 0.0
    pp_s: float = 0.0

    def amortised_s(self, sync_every: int) -> float:
        """Predicted seconds per step when the DP exchange runs once every `sync_every` steps."""
        return self.dp_s / sync_every + self.pp_s


def planned_layouts(cluster: Cluster, job: Job, config: WanBenchConfig, policy_text: str | None = None
                    ) -> dict[str, PlannedLayout]:
    """Per layout "SxR" using every device (S dividing the model's blocks, R x micro-batches dividing
    the global batch): the `auto` search's assignment under "yuan" and the codec choice for it under
    `policy_text` (default: config.codec_policy)."""
    from geotrain.search import PlacementProblem, run_search

    n, policy = cluster.n_devices, parse_codec_policy(policy_text or config.codec_policy)
    layouts = {}
    for stages in (s for s in range(1, job.layers + 1) if job.layers % s == 0 and n % s == 0):
        replicas = n // stages
        if config.global_batch % (replicas * config.microbatches):
            continue
        problem = PlacementProblem(cluster, YuanCostModel.for_job(cluster, job, stages, replicas))
        result = run_search("auto", problem, seed=config.seed, time_limit_s=10.0)
        assignment = np.asarray(result.assignment)
        layouts[f"{stages}x{replicas}"] = PlannedLayout(assignment, result.cost.total,
                                                        choose_codecs(cluster, job, assignment, policy),
                                                        result.cost.dp, result.cost.pp)
    if not layouts:
        raise WanBenchError(f"no layout of {n} devices fits {job.layers} blocks and a global batch of "
                            f"{config.global_batch} in {config.microbatches} micro-batches")
    return layouts


def _row_available(row: WanRow) -> str | None:
    """None if this geotrain's RuntimeConfig has every setting the row sets (a torchft row: if torchft is
    installed), else the reason it is skipped."""
    from geotrain.runtime.config import setting_keys

    if row.engine == "torchft":
        import importlib.util

        return None if importlib.util.find_spec("torchft") else "torchft is not installed (pip install geotrain[ft])"
    missing = [key for key, _ in row.options if key not in setting_keys()]
    return None if not missing else f"RuntimeConfig has no field {', '.join(missing)} in this geotrain"


def _evaluate(directory: str, step: int, run: Any, config: WanBenchConfig,
              world: Any) -> tuple[float, list[dict[str, Any]]]:
    """Validation loss of replica 0's stages at checkpoint `step` (the run's own layer model and split,
    evaluated unsplit in this process), and every rank's records there."""
    from geotrain.models import even_boundaries
    from geotrain.models.evaluate import validation_loss
    from geotrain.runtime import checkpoint as ckpt
    from geotrain.models import MODEL_PRESETS
    from geotrain.runtime.stages import build_layer_model, stage_modules

    stages, replicas = run.stages, run.replicas
    model = build_layer_model(run.model.model_name, MODEL_PRESETS, run.run.seed, world.vocab_size, run.sequence_length)
    cuts = even_boundaries(model.n_layers, stages)  # the run's split (--split layers)
    manifest = ckpt.read_manifest(directory, step)
    modules, records = [], []
    for rank in range(stages * replicas):
        stage, replica = divmod(rank, replicas)
        state = ckpt.load_shard(directory, step, rank, manifest, {"rank": rank, "stage": stage, "replica": replica})
        records.extend(state["records"])
        if replica == 0:
            module = stage_modules(model, cuts, [stage])[stage]
            module.load_state_dict({key.removeprefix("0."): value for key, value in state["stage"].items()})
            modules.append(module)
    loss = validation_loss(modules, world.val.numpy(), run.sequence_length, max_windows=config.val_windows)
    return loss, records


def eval_steps_of(config: WanBenchConfig, sync_every: int, offset: int = 0) -> list[int]:
    """The steps a row is scored at: synchronised weights only (with local SGD, steps that end an outer period;
    with `offset` tau, the steps its syncs land at)."""
    every = math.lcm(config.eval_every, sync_every)
    return sorted({*range(every + offset, config.steps + 1, every), config.steps})


def score_row(row: WanRow, assignment: np.ndarray, codecs: dict[str, list[str]], eval_steps: list[int],
              losses: list[float], records: list[dict[str, Any]], config: WanBenchConfig) -> RowResult:
    """A trained row's RowResult from its validation losses at `eval_steps` and every rank's step records."""
    seconds = emulated_step_seconds(records, config.steps)
    elapsed = np.cumsum(seconds)
    eval_time = [float(elapsed[step - 1]) for step in eval_steps]
    reached = [t for t, loss in zip(eval_time, losses) if loss <= config.target]
    inter = float(sum(r["emulated"]["inter_region_bytes"] for r in records))
    stages, replicas = assignment.shape
    return RowResult(row, int(stages), int(replicas), assignment.tolist(), codecs, eval_steps, eval_time, losses,
                     float(np.mean(seconds[1:] if len(seconds) > 1 else seconds)), inter,
                     reached[0] if reached else None, compute_fraction(records, seconds),
                     peak_profile(records, seconds))


def run_row(row: WanRow, cluster: Cluster, assignment: np.ndarray, choice: CodecChoice | None,
            config: WanBenchConfig, tokens: Any, progress: Callable[[int, int], None] | None = None) -> RowResult:
    """Train one row for config.steps steps and score it from its checkpoints. A row whose syncs land late
    (sync_delay tau > 0) has a sync in flight at most steps, which a checkpoint refuses: it is checkpointed at
    the end only and scored by the runtime's evaluation of replica 0's current weights on the same windows
    (data.eval_local: no collective, outside emulated time, so no sync travels during it), tau steps after
    each period that a blocking row is scored at (data.eval_offset): when the sync started there has landed
    (fragment 0's, the one that syncs at the period's end), not while it is in flight. Delayed gradients
    (every step's exchange in flight: replicas equal at every step) are scored at the blocking steps."""
    from geotrain.observe.run import recording, row_run_dir
    from geotrain.runtime import RuntimeConfig, launch

    stages, replicas = assignment.shape
    per_link: dict[str, Any] = {}
    if row.plan_codecs and choice is not None:
        per_link = {"dp_codecs": choice.dp, "pp_codecs": choice.pp}
    in_flight = row.sync_delay > 0
    # delayed gradients keep the replicas equal at every step: scored where a blocking row is (no offset)
    offset = 0 if row.delayed_gradients else row.sync_delay
    eval_steps = eval_steps_of(config, row.sync_every, offset)
    scoring = ({"checkpoint_every": 0, "eval_every": math.lcm(config.eval_every, row.sync_every),
                "eval_offset": offset, "eval_windows": config.val_windows, "eval_local": True} if in_flight
               else {"checkpoint_every": config.eval_every, "keep_checkpoints": config.steps // config.eval_every + 1})
    with tempfile.TemporaryDirectory(prefix="geotrain-wan-") as directory:
        run = RuntimeConfig.of(cluster, assignment, row.label, steps=config.steps,
                               microbatches=config.microbatches, batch_size=config.global_batch // replicas,
                               lr=config.lr, dp_codec=row.dp_codec, pp_codec=row.pp_codec, time_scale=config.time_scale,
                               seed=config.seed, checkpoint_dir=directory, compute_clock=config.compute_clock,
                               gpt=_preset(config.model), model_name=config.model, **scoring,
                               run_dir=None if config.run_dir is None else row_run_dir(config.run_dir, row.label),
                               **per_link, **dict(row.options))
        with recording(run):
            launch(run, progress=progress, tokens=tokens)
        if in_flight:  # replica 0's records come first (ranks in order)
            records = _evaluate(directory, config.steps, run, config, tokens)[1]
            losses = [next(r["val_loss"] for r in records if r["step"] == step - 1 and r["val_loss"] is not None)
                      for step in eval_steps]
        else:
            scored = [_evaluate(directory, step, run, config, tokens) for step in eval_steps]
            records, losses = scored[-1][1], [loss for loss, _ in scored]
    codecs = {"dp": [str(run.comm.stage_dp_codec(s)) for s in range(stages)],
              "pp": [str(run.comm.cut_pp_codec(c)) for c in range(stages - 1)]}
    return score_row(row, assignment, codecs, eval_steps, losses, records, config)


def run_wan_bench(config: WanBenchConfig, progress: Callable[[str, int, int], None] | None = None) -> WanBench:
    """Plan, then train every available row; `progress(label, done, total)`."""
    from geotrain.data import world_tokens

    cluster = load_cluster(bench_cluster(config.cluster))
    job = model_job(config.global_batch, config.model)
    by_policy = {policy: planned_layouts(cluster, job, config, policy)
                 for policy in {config.codec_policy, *(row.policy for row in config.rows if row.policy)}}
    layouts = by_policy[config.codec_policy]
    fp32 = min(layouts.values(), key=lambda layout: layout.cost_s)  # the planner without codecs
    naive = np.arange(cluster.n_devices, dtype=np.int64).reshape(1, -1)
    if config.global_batch % (cluster.n_devices * config.microbatches):
        raise WanBenchError(f"the DDP baseline needs a global batch divisible by {cluster.n_devices} devices x "
                            f"{config.microbatches} micro-batches, got {config.global_batch}")
    tokens = world_tokens(0)
    results: list[RowResult | WanRow] = []
    skipped = []
    for row in config.rows:
        reason = _row_available(row)
        if reason is not None:
            skipped.append((row.label, reason))
            continue
        if row.recipe:  # run after the limit row, whose step time is the compute the planner needs
            results.append(row)
            continue
        # with codecs: the layout whose cost with its codec choice is lowest (layout and codecs together);
        # synchronising every H steps: the layout whose cost with the DP term amortised over H is lowest
        if row.plan_codecs:
            planned = min(by_policy[row.policy or config.codec_policy].values(),
                          key=lambda layout: layout.choice.cost["total"])
        elif row.sync_every > 1:
            planned = min(layouts.values(), key=lambda layout, h=row.sync_every: layout.amortised_s(h))
        elif row.delayed_gradients:  # the DP exchange hides behind compute: the layout with the least pipeline time
            planned = min(layouts.values(), key=lambda layout: (layout.pp_s, layout.cost_s))
        else:
            planned = fp32
        assignment = naive if row.placement == "naive" else planned.assignment
        callback = None if progress is None else (lambda done, total, label=row.label: progress(label, done, total))
        row_cluster = zero_cost_links(cluster) if row.free_links else cluster
        if row.engine == "torchft":
            from geotrain.bench.wan_torchft import run_torchft_row

            results.append(run_torchft_row(row, row_cluster, assignment, config, tokens, callback))
            continue
        results.append(run_row(row, row_cluster, assignment, planned.choice, config, tokens, callback))
    if any(isinstance(r, WanRow) for r in results):
        from geotrain.bench.wan_recipe import run_recipe_row
        from geotrain.cost.convergence import crossing_step

        limit = next((r for r in results if isinstance(r, RowResult) and r.row.free_links), None)
        if limit is None:
            raise WanBenchError("the recipe row needs the limit row (free links): its step time is the compute per step")
        target_steps = crossing_step(limit.eval_steps, limit.val_losses, config.target)  # T0, as the model was fitted
        results = [run_recipe_row(r, cluster, job, layouts, config, tokens, limit.step_time_s, progress, target_steps)
                   if isinstance(r, WanRow) else r for r in results]
    results = _predict_delayed_gradients(results, cluster, job, layouts)
    summary = {name: {"uncompressed_s": layout.cost_s, "with_codecs_s": layout.choice.cost["total"],
                      "dp_codecs": list(layout.choice.dp), "pp_codecs": list(layout.choice.pp)}
               for name, layout in layouts.items()}
    coded = min(layouts.values(), key=lambda layout: layout.choice.cost["total"])
    return WanBench(config, cluster, tuple(r for r in results if isinstance(r, RowResult)), tuple(skipped),
                    coded.choice, summary)


def _predict_delayed_gradients(results: list[Any], cluster: Cluster, job: Job,
                               layouts: dict[str, PlannedLayout]) -> list[Any]:
    """Delayed-gradients rows with the cost model's step seconds (cost.wan_recipe.delayed_gradients_step_seconds)
    for the limit row's compute per step, as the recipe row's prediction; unchanged without a limit row."""
    from geotrain.cost.wan_recipe import delayed_gradients_step_seconds

    limit = next((r for r in results if isinstance(r, RowResult) and r.row.free_links), None)
    if limit is None:
        return results
    pp_s = {tuple(map(tuple, layout.assignment.tolist())): layout.pp_s for layout in layouts.values()}
    return [dataclasses.replace(r, predicted_step_s=delayed_gradients_step_seconds(
                cluster, job, r.assignment, limit.step_time_s, r.row.dp_codec, r.row.sync_delay,
                pp_s.get(tuple(map(tuple, r.assignment)), 0.0)))
            if isinstance(r, RowResult) and r.row.delayed_gradients else r for r in results]
