"""`geotrain plan` on a cluster with prices: what a step of the plan costs, and `--objective cost`.

A plan's "money" object (cost/money.py) prices its predicted step: the GPU-hours of the devices it uses and the
bytes that leave each region, as the plan moves them: per-step data parallelism (uncompressed gradients and
activations), the WAN recipe's outer sync (its codec's payload every H steps) or asynchronous updates (the fp32
model to the server and back every H steps). `--objective cost` (auto-configuration) ranks layouts by the money
to make the same progress: USD per step times the recipe's staleness charge (charged step / step).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import numpy as np

from geotrain.cli.plan_recipe import PricedRecipe
from geotrain.cluster import Cluster
from geotrain.cost.money import (SECONDS_PER_HOUR, StepMoney, egress_bytes, exchange_pair_bytes, star_bytes,
                                 step_money)
from geotrain.cost.shards import slot_view
from geotrain.errors import GeotrainError
from geotrain.job import Job

OBJECTIVES = ("time", "cost")


def add_objective_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--objective", default="time", choices=OBJECTIVES,
                        help="auto-configuration ranks layouts by predicted time per step, or by money (cost: USD "
                             "per step x the recipe's staleness charge; needs the cluster file's prices)")


def check_objective(args: Any, cluster: Cluster, fixed_layout: bool) -> None:
    """GeotrainError for --objective cost without prices, or with a fixed layout (its search minimises time)."""
    if args.objective != "cost":
        return
    if fixed_layout:
        raise GeotrainError("--objective cost ranks auto-configured layouts: give neither --stages nor --replicas "
                            "(a fixed layout's placement search minimises time; its plan still shows its money)")
    if cluster.prices is None:
        raise GeotrainError(f"--objective cost: cluster {cluster.name!r} has no prices (add prices: {{gpu_hour: "
                            "{TYPE: USD}, egress_per_gb: USD}} to its file)")


def plan_money(cluster: Cluster, job: Job, assignment: Any, step_s: float, priced: PricedRecipe | None) -> StepMoney:
    """USD of one predicted step of `assignment` (module doc); `priced`: the plan's recipe, None for per-step DP."""
    assignment = np.asarray(assignment, dtype=np.int64)
    stages, replicas = (int(n) for n in assignment.shape)
    pp_bytes = job.pp_bytes(replicas) if stages > 1 else 0.0
    if priced is None or priced.chosen == "batch_shares":
        pair = exchange_pair_bytes(job.dp_bytes(stages), replicas, gathered=False)
        return step_money(cluster, assignment, step_s, egress_bytes(cluster, assignment, pair, pp_bytes))
    recipe = priced.recipe
    values = job.dp_bytes(stages) / job.bytes_per_value
    if recipe.outer_sync != "sync":
        egress = star_bytes(cluster, assignment, 4.0 * values, recipe.sync_every) + \
            egress_bytes(cluster, assignment, 0.0, pp_bytes)
        return step_money(cluster, assignment, step_s, egress)
    from geotrain.codecs import CodecSpec  # torch-backed: imported only when a recipe is priced
    from geotrain.comm import reducer_traits

    spec = CodecSpec.parse(recipe.codec)
    payload = values * spec.build().bytes_per_value(job.hidden, job.bytes_per_value)
    pair = exchange_pair_bytes(payload, replicas, gathered=reducer_traits(spec).gathered, period=recipe.sync_every)
    return step_money(cluster, assignment, step_s, egress_bytes(cluster, assignment, pair, pp_bytes))


def sharded_plan_money(cluster: Cluster, job: Job, devices: Any, step_s: float,
                       priced: PricedRecipe | None) -> StepMoney:
    """`plan_money` of a sharded layout `devices` (S, R, K): egress as its slots move it (K same-shard exchanges of
    1/K: the bytes of one device per slot), GPU-hours of every device of every slot."""
    slots, _, assignment = slot_view(cluster, devices)
    money = plan_money(slots, job, assignment, step_s, priced)
    per_hour = sum(cluster.prices.gpu_hour_usd[cluster.gpus[d]] for d in np.unique(np.asarray(devices)))
    return replace(money, gpu_usd=per_hour * step_s / SECONDS_PER_HOUR)


def money_line(money: StepMoney, steps: int | None = None) -> str:
    """One line for people: per step, per hour, the split, and the run's with `steps`."""
    run = f"; {steps} steps: ${money.usd * steps:,.2f}" if steps else ""
    return (f"Money: ${money.usd:.4g} per step (GPUs ${money.gpu_usd:.4g}, egress ${money.egress_usd:.4g} for "
            f"{sum(money.egress_gb):.3g} GB), ${money.usd_per_hour:,.2f} per hour{run}.")
