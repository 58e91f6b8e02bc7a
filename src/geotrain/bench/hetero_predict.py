"""bench hetero's predictions and its `recipe` row's plan, from the bench's measured compute per step.

The compute (`measured_compute_s`): each rank's median compute seconds per step in the limit row's run (DDP with
equal batches on free links, each rank at its GPU's speed: what one inner step of the same per-replica batch
costs there), as bench wan's recipe row takes its compute from its limit row. With it:
- `plan_recipe`: what `geotrain plan --wan-recipe auto` chooses for one replica per site, by predicted time to
  target (T0: the limit row's steps to the target, `target_steps_of`)
  (cost.wan_recipe.choose_local_steps: equal or adaptive local steps, H, P, tau, codec), with the outer codecs'
  CPU per sync timed on this machine, where the ranks run (cost.codec_cpu, as `plan --recipe-measure-codecs`);
- `predict_row`: the planner's step seconds and per-site compute fractions for a row's own settings: per-step DP
  (`batch_shares` equal or speed) by cost.batch_shares with the DP exchange of `dp_codec` every step; DiLoCo
  (`sync_every`, equal or adaptive `local_steps`, `fragments`, `sync_delay`, `dp_codec`) by
  cost.wan_recipe.setting_step_seconds; flat asynchronous outer updates (`outer_sync` async) by cost.async_outer
  (cost.wan_recipe.async_recipe). Not priced: the hierarchical asynchronous variant, moment sync, and the limit
  (modelled from the same measurement).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.batch_shares import predict_shares_of, share_samples
from geotrain.cost.local_steps import period_local_steps, replica_compute_per_step
from geotrain.cost.wan_recipe import (WanRecipe, async_recipe, choose_local_steps, fragment_sync_seconds,
                                      outer_ladder, setting_step_seconds)
from geotrain.job import Job


@dataclass(frozen=True)
class RowPrediction:
    """The planner's seconds per step for a row, and each site's compute seconds over them."""

    step_s: float
    site_compute_fraction: dict[str, float]


def measured_compute_s(records: Sequence[Mapping[str, Any]], ranks: int) -> np.ndarray:
    """(ranks,) each rank's median `compute_s` over its step records (seconds per step)."""
    seconds: dict[int, list[float]] = defaultdict(list)
    for record in records:
        seconds[int(record["rank"])].append(float(record["compute_s"]))
    return np.array([float(np.median(seconds[rank])) for rank in range(ranks)])


def site_names(cluster: Cluster) -> list[str]:
    """The site (region) of each device: one replica per device, as bench hetero runs."""
    return [cluster.site_of(d) for d in range(cluster.n_devices)]


def one_per_site(cluster: Cluster) -> np.ndarray:
    """The bench's plan: one stage, replica r on device r."""
    return np.arange(cluster.n_devices, dtype=np.int64).reshape(1, -1)


def plan_recipe(cluster: Cluster, job: Job, compute_s: Sequence[float], total_steps: int,
                codec_s_per_value: Mapping[str, float], target_steps: float | None = None) -> WanRecipe:
    """The planner's recipe for one replica per site, `compute_s` per replica, a run of `total_steps`, per-step
    fp32 DP's `target_steps` to the target (cost.convergence's T0; None: the run's length); asynchronous outer
    updates priced too, as `plan --recipe-outer-sync auto`."""
    return choose_local_steps(cluster, job, one_per_site(cluster), compute_s, asynchronous=True,
                              total_steps=total_steps, codec_s_per_value=codec_s_per_value, target_steps=target_steps)


def target_steps_of(records: Sequence[Mapping[str, Any]], target: float) -> float | None:
    """Steps at which rank 0's evaluations in a run's records (the limit row's: per-step fp32 DP, cost.convergence's
    T0) reach `target`, interpolated between the two around it as the model's constants were fitted
    (convergence.crossing_step); None if none does."""
    from geotrain.cost.convergence import crossing_step

    points = sorted((int(r["step"]) + 1, float(r["val_loss"])) for r in records
                    if r["rank"] == 0 and r.get("val_loss") is not None)
    return crossing_step([s for s, _ in points], [loss for _, loss in points], target)


def codec_seconds(cluster: Cluster) -> dict[str, float]:
    """CPU seconds per synchronised value of one sync's codec work, by outer codec, timed here."""
    from geotrain.cost.codec_cpu import sync_codec_seconds_by_codec

    return sync_codec_seconds_by_codec(outer_ladder(), cluster.n_devices)


def predict_row(options: Mapping[str, Any], cluster: Cluster, job: Job, compute_s: Sequence[float],
                codec_s_per_value: Mapping[str, float], batch_size: int, unit: int = 1) -> RowPrediction | None:
    """The planner's prediction for a row of RuntimeConfig `options` (module doc), `batch_size` samples per replica
    with equal shares, shares in whole micro-batches of `unit`; None where it prices none."""
    assignment, sites = one_per_site(cluster), site_names(cluster)
    outer_sync = options.get("outer_sync", "sync")
    if outer_sync == "async":
        priced = async_recipe(cluster, job, assignment, compute_s, int(options["sync_every"]))
        return RowPrediction(priced.step_s, {site: float(c / priced.step_s)
                                             for site, c in zip(sites, priced.replica_compute_s or ())})
    if outer_sync != "sync" or options.get("sync_moments"):
        return None
    codec, fragments = str(options.get("dp_codec", "none")), int(options.get("fragments", 1))
    sync_s = fragment_sync_seconds(cluster, job, assignment, fragments, codec)
    every = options.get("sync_every")
    if every is None:  # per-step DP: the whole model's exchange every step
        samples = share_samples(options.get("batch_shares", "equal"), cluster, assignment, batch_size, unit)
        shares = predict_shares_of(compute_s, samples, sync_s)
        return RowPrediction(shares.step_s, dict(zip(sites, shares.compute_fraction)))
    every = int(every)
    steps = period_local_steps(compute_s, every, str(options.get("local_steps", "equal")))
    values = job.dp_bytes(1) / job.bytes_per_value
    step_s = setting_step_seconds(sync_s, compute_s, steps, every, fragments, int(options.get("sync_delay", 0)),
                                  codec_cpu_s=codec_s_per_value.get(codec, 0.0) * values,
                                  landing=str(options.get("sync_landing", "mix")))
    per_step = replica_compute_per_step(compute_s, steps, every)
    return RowPrediction(step_s, {site: float(c / step_s) for site, c in zip(sites, per_step)})
