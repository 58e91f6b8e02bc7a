"""`geotrain plan --wan-recipe auto`: the recipe of a placement and what it needs.

One home for the recipe's planning, used by a fixed layout (cli/plan_cmd.py) and by auto-configuration
(cli/plan_autoconfig.py, which chooses the layout and the recipe together):
- `price_recipe`: the WAN recipe of an assignment (cost.wan_recipe: H, fragments, delay, outer codec, equal or
  adaptive local steps, sync or async outer updates) and, where the replicas differ in GPU speed, per-step data
  parallelism with speed batch shares against it (cost.batch_shares); `PricedRecipe.charged_s` is what layouts
  are ranked by (the recipe's step times its staleness charge, or the shares' step where they win).
- `layout_memory_bytes`: what one device of a stage holds (weights, gradients, AdamW state, under a recipe also
  the outer sync's anchor, momentum and error-feedback residual, cost.memory.RECIPE_OUTER_BYTES_PER_PARAM, plus one
  sequence's activations: the least any micro-batching needs), `devices_that_fit` and `too_few_devices` (the one
  line naming the devices that fall short and their memory).
- `--outer-state host` (`device_outer_bytes_per_param`, `outer_state_document`): `train` keeps the outer sync's state
  in host memory (train --outer-state host, geotrain.optim.outer_state), so the devices' memory checks leave it out
  and a model fits devices it did not; the plan records "outer_state": "host", which `train --plan` runs with.
  Synchronous recipes only (the asynchronous sync keeps its anchor beside the parameters).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from geotrain.cli.arg_types import positive_float
from geotrain.cli.output import Output
from geotrain.cluster import Cluster
from geotrain.cluster.gpus import memory_text
from geotrain.cost.batch_shares import SharesChoice, choose_shares, heterogeneous, replica_compute_seconds, replica_labels
from geotrain.cost.memory import OUTER_STATES, RECIPE_OUTER_BYTES_PER_PARAM, MemoryConfig, stage_memory_bytes
from geotrain.errors import GeotrainError
from geotrain.cost.wan_recipe import (DEFAULT_CODEC_FLOOR, OUTER_LADDER, SYNC_EVERY_CHOICES, MIN_OUTER_STEPS,
                                      WanRecipe, charged_step_seconds, choose_local_steps, estimated_compute_s,
                                      outer_ladder)
from geotrain.job import Job


RECIPE_COST_MODEL = "yuan+compute"
"""A fixed layout's placement model under --wan-recipe auto when --cost-model is not given: the recipe weighs each
replica's compute against the links, so the placement must know each GPU's speed ("yuan" has no compute)."""


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    recipe = parser.add_argument_group("WAN recipe: Streaming DiLoCo settings chosen by cost (docs/history/wan.md)")
    recipe.add_argument("--wan-recipe", default="none", choices=("none", "auto"),
                        help="auto: choose sync period H, fragments P, delay tau and the outer codec (recorded in "
                             "the plan as \"wan_recipe\"; `geotrain train --plan` runs them); without --stages/"
                             "--replicas the layout is chosen with the recipe, by the recipe's predicted step")
    recipe.add_argument("--compute-s", type=positive_float, default=None, metavar="SEC",
                        help="compute seconds per step (default: the yuan+compute model's estimate from the GPUs, "
                             "at --calibration's measured utilisation where given)")
    recipe.add_argument("--recipe-steps", type=int, default=None, metavar="N",
                        help="the run's steps: H leaves at least 12 outer steps, and under 100 outer steps the "
                             "outer optimizer averages (lr 1, momentum 0) instead of DiLoCo's 0.7 / 0.9")
    recipe.add_argument("--recipe-max-delay", type=int, default=None, metavar="TAU",
                        help="largest delay tau (default H - 1; 0 where syncs may not be in flight at checkpoints)")
    recipe.add_argument("--recipe-outer-sync", default="auto", choices=("auto", "sync"),
                        help="auto: also price asynchronous outer updates (one stage per replica, fp32 updates; "
                             "cost.async_outer) and choose them where their predicted time to target is sooner; "
                             "sync: synchronous only")
    recipe.add_argument("--recipe-codec-floor", default=DEFAULT_CODEC_FLOOR, choices=OUTER_LADDER,
                        help=f"lowest outer codec allowed on the ladder {' > '.join(OUTER_LADDER)}")
    recipe.add_argument("--recipe-measure-codecs", action="store_true",
                        help="time the outer codecs on this machine and price their CPU per sync (use when this "
                             "machine's CPUs are like the training hosts'; default: links only)")
    recipe.add_argument("--recipe-sync-moments", action="store_true",
                        help="each fragment's first outer sync also averages the inner AdamW's moments (train "
                             "--sync-moments --moment-syncs 1: on bench wan local SGD's +0.033 nats against DDP become "
                             "+0.015, for about 3x that sync's bytes); the recipe is priced with them")
    recipe.add_argument("--outer-state", default="device", choices=OUTER_STATES,
                        help="where train keeps the outer sync's state (anchor, outer momentum, error-feedback "
                             "residual: 12 bytes per parameter): device (counted in every device's memory) or host "
                             "(host memory, not counted: a model fits devices it did not; recorded in the plan, "
                             "which train --plan runs with --outer-state host; synchronous recipes only)")


def device_outer_bytes_per_param(recipe: bool, outer_state: str) -> float:
    """Bytes per parameter of the outer sync's state that a device holds: under a recipe with the state on the
    device, its anchor, momentum and residual (cost.memory.RECIPE_OUTER_BYTES_PER_PARAM); else none."""
    return RECIPE_OUTER_BYTES_PER_PARAM if recipe and outer_state == "device" else 0.0


def outer_state_document(args: Any) -> dict[str, Any]:
    """What a plan records of --outer-state ({"outer_state": "host"}, or nothing for the default); GeotrainError
    (one line) for host without --wan-recipe auto: only a recipe plans the outer sync's state."""
    if args.outer_state == "device":
        return {}
    if args.wan_recipe != "auto":
        raise GeotrainError(f"--outer-state {args.outer_state} says where the outer sync's state lives, which the "
                            f"planner counts under a WAN recipe only: add --wan-recipe auto")
    return {"outer_state": args.outer_state}


@dataclass(frozen=True)
class PricedRecipe:
    """A placement's recipe and, on mixed GPUs, per-step DP with speed batch shares against it."""

    recipe: WanRecipe
    shares: SharesChoice | None

    @property
    def chosen(self) -> str:
        """"wan_recipe", or "batch_shares" where per-step DP with speed shares is predicted faster."""
        return "wan_recipe" if self.shares is None else self.shares.chosen

    @property
    def step_s(self) -> float:
        """The chosen scheme's predicted seconds per step."""
        return self.recipe.step_s if self.chosen == "wan_recipe" else self.shares.step_s

    @property
    def scheme(self) -> str:
        """The chosen scheme in words, for tables and explanations."""
        return "WAN recipe" if self.chosen == "wan_recipe" else "speed batch shares"

    @property
    def busiest_compute_s(self) -> float:
        """The busiest replica's compute seconds per step under the chosen scheme."""
        return self.recipe.compute_s if self.chosen == "wan_recipe" else max(self.shares.shares.compute_s)

    @property
    def charged_s(self) -> float:
        """Predicted time to target per step of per-step DP's (cost.wan_recipe.charged_step_seconds: the step times
        the convergence factor, cost.convergence): what layouts rank by."""
        return charged_step_seconds(self.recipe) if self.chosen == "wan_recipe" else self.shares.step_s


def add_calibration_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calibration", default=None, metavar="FILE",
                        help="a `geotrain calibrate` file: every model with compute (yuan+compute, schedule, the "
                             "recipe's) charges each GPU at its measured utilisation instead of the default 0.4 of peak")


def calibration_of(args: Any, job: Job) -> dict[str, Any] | None:
    """--calibration: sets `args.utilisation` (what every compute model charges) and returns the plan's
    "calibration" record; one note when the calibrated model's parameters differ from the job's by over 10%.
    None without it (args.utilisation None: the default)."""
    args.utilisation = None
    if getattr(args, "calibration", None) is None:
        return None
    from geotrain.cost.calibration import load_calibration

    calibration = load_calibration(args.calibration)
    args.utilisation = calibration.utilisation
    if abs(calibration.params - job.params) > 0.1 * job.params:
        print(f"geotrain: note: --calibration {args.calibration} measured {calibration.model} ({calibration.params:,} "
              f"parameters), the job {job.name!r} has {job.params:,.0f}: its FLOPs are charged at that model's "
              f"utilisation", file=sys.stderr)
    return {"file": str(args.calibration), "model": calibration.model, "stands_for": calibration.stands_for,
            "seconds_per_step": calibration.seconds_per_step, "utilisation": calibration.utilisation}


def largest_sync_every(total_steps: int | None) -> int:
    """The largest H the recipe may choose (SYNC_EVERY_CHOICES, capped to leave MIN_OUTER_STEPS outer steps)."""
    allowed = [h for h in SYNC_EVERY_CHOICES if total_steps is None or h * MIN_OUTER_STEPS <= total_steps]
    return max(allowed or [min(SYNC_EVERY_CHOICES)])


def recipe_compute_s(args: Any, cluster: Cluster, job: Job, assignment: Any, utilisation: float | None = None) -> float:
    """The slowest replica's compute seconds per step: --compute-s, else the yuan+compute estimate at `utilisation`
    of each GPU's peak (None: the default; plan --calibration gives a measured one)."""
    if args.compute_s is not None:
        return args.compute_s
    return estimated_compute_s(cluster, job, assignment, utilisation)


def price_recipe(args: Any, cluster: Cluster, job: Job, assignment: Any, dp_s: float, pp_s: float,
                 compute_s: float | None = None, utilisation: float | None = None) -> PricedRecipe:
    """The recipe of `assignment` (pipeline seconds per step `pp_s`; equal or adaptive local steps, replica r
    computing the slowest replica's seconds x v_min / v_r by GPU peak) and, on mixed GPUs, speed batch shares with
    per-step DP (communication `dp_s` + `pp_s` seconds per step) against it. The slowest replica's compute per
    step: --compute-s, else `compute_s` (a model's own), else the yuan+compute estimate at `utilisation`."""
    assignment = np.asarray(assignment, dtype=np.int64)
    if args.compute_s is not None or compute_s is None:
        compute_s = recipe_compute_s(args, cluster, job, assignment, utilisation)
    codec_s = moment_codec_s = None
    if args.recipe_measure_codecs:
        from geotrain.cost.codec_cpu import sync_codec_seconds_by_codec

        ladder, replicas = outer_ladder(args.recipe_codec_floor), int(assignment.shape[1])
        codec_s = sync_codec_seconds_by_codec(ladder, replicas)
        if args.recipe_sync_moments:
            moment_codec_s = sync_codec_seconds_by_codec(ladder, replicas, sync_moments=True)
    recipe = choose_local_steps(cluster, job, assignment, replica_compute_seconds(cluster, assignment, compute_s),
                                pp_s=pp_s, total_steps=args.recipe_steps, max_delay=args.recipe_max_delay,
                                floor=args.recipe_codec_floor, sync_moments=args.recipe_sync_moments,
                                codec_s_per_value=codec_s, moment_codec_s_per_value=moment_codec_s,
                                asynchronous=args.recipe_outer_sync == "auto" and args.outer_state == "device")
    shares = None
    if heterogeneous(cluster, assignment):
        shares = choose_shares(cluster, assignment, job.global_batch, compute_s, dp_s + pp_s, recipe.step_s,
                               recipe.replica_compute_s)
    return PricedRecipe(recipe, shares)


def recipe_documents(cluster: Cluster, assignment: Any, priced: PricedRecipe) -> dict[str, Any]:
    """The plan's "wan_recipe", or "batch_shares" when they win; "site_compute" with either on a
    heterogeneous cluster."""
    if priced.shares is None:
        return {"wan_recipe": priced.recipe.to_json()}
    site = {"site_compute": priced.shares.to_json(replica_labels(cluster, assignment))}
    if priced.chosen == "wan_recipe":
        return {"wan_recipe": priced.recipe.to_json(), **site}
    labels = replica_labels(cluster, assignment)
    return {"batch_shares": {"version": 1, "rule": "speed", **priced.shares.shares.to_json(labels)}, **site}


def layout_memory_bytes(job: Job, stages: int, replicas: int, shards: int = 1, recipe: bool = True,
                        outer_state: str = "device") -> float:
    """Bytes the busiest device of an S x R layout holds: mixed-precision AdamW state (under a recipe, `recipe`,
    plus the outer sync's fp32 anchor, momentum and error-feedback residual) for its stage's parameters, and one
    sequence's activations per micro-batch in flight (cost.memory; the least any micro-batching of the replica's batch
    needs); `shards`: K devices per slot sharing it (FSDP2, cost.memory's sharded states); `outer_state` "host": the
    outer sync's state is in host memory, not counted."""
    per_replica = max(1, job.global_batch // replicas)
    outer = device_outer_bytes_per_param(recipe, outer_state)
    config = MemoryConfig(state_bytes_per_param=MemoryConfig().state_bytes_per_param + outer)
    return float(stage_memory_bytes(job, stages, replicas, per_replica, config, shards=shards).max())


def devices_that_fit(cluster: Cluster, need_bytes: float) -> np.ndarray:
    """Indices of the devices whose GPU memory holds `need_bytes`."""
    return np.flatnonzero(cluster.memory_bytes >= need_bytes)


def too_few_devices(cluster: Cluster, need_bytes: float, fit: np.ndarray, what: str, recipe: bool = True) -> str:
    """The one line saying that only `fit` of the devices hold `need_bytes`, naming the others' GPUs and memory.
    `what`: the layout, for the message; `recipe`: the need counts the outer sync's state."""
    capacity = cluster.memory_bytes
    kinds = Counter((cluster.gpus[d], float(capacity[d])) for d in np.flatnonzero(capacity < need_bytes))
    named = ", ".join(f"{gpu} ({memory_text(memory)}) x{count}"
                      for (gpu, memory), count in sorted(kinds.items(), key=lambda kind: -kind[0][1]))
    state = "AdamW and the outer sync's state (anchor, momentum, residual)" if recipe else "AdamW state"
    return (f"{what} needs {need_bytes / 1e9:.3g} GB on every device (weights, gradients, {state} of its stage, one "
            f"sequence's activations), and only {fit.size} of {cluster.n_devices} devices hold it; too small: {named}")


def recipe_tables(out: Output, cluster: Cluster, assignment: Any, priced: PricedRecipe) -> None:
    """The shares-vs-recipe table (mixed GPUs) and the chosen recipe's table."""
    labels = replica_labels(cluster, assignment)
    shares = priced.shares
    if shares is not None:
        fractions = [[f"compute fraction {name}", f"{f:.3f}"] for name, f in zip(labels, shares.compute_fraction)]
        out.table("per-step DP with speed batch shares vs the WAN recipe (predicted, yuan)", ["", "value"],
                  [["chosen", shares.chosen],
                   ["samples per replica (speed)", ", ".join(map(str, shares.shares.samples))],
                   ["step, speed shares (s)", f"{shares.shares.step_s:.4g}"],
                   ["step, equal shares (s)", f"{shares.equal.step_s:.4g}"],
                   ["step, WAN recipe (s)", f"{shares.recipe_step_s:.4g}"],
                   *(fractions if shares.chosen == "batch_shares" else [])])
    if priced.chosen == "wan_recipe":
        recipe_table(out, priced.recipe, labels)


def recipe_table(out: Output, recipe: WanRecipe, labels: list[str]) -> None:
    """The chosen WAN recipe, its local steps (and both schedules' predicted steps), each outer sync's step and
    the step charged by the convergence model (time to target per step of per-step DP: what the rule compares), and
    each site's predicted compute fraction."""
    steps = recipe.local_steps_step_s or {}
    local = ("equal (H on every replica)" if recipe.local_steps == "equal" else
             f"adaptive ({' / '.join(map(str, recipe.replica_steps or ()))} per period at first)")
    fractions = recipe.replica_compute_fraction or ()
    outer_sync = ("synchronous" if recipe.outer_sync == "sync" else
                  f"asynchronous (staleness x{recipe.async_staleness_factor:.3g})")
    charged = recipe.outer_sync_charged_s or {}
    outer_rows = [[f"step, {name} (s): predicted / charged (to target)",
                   f"{step:.4g} / {charged[name]:.4g}" if name in charged else f"{step:.4g}"]
                  for name, step in (recipe.outer_sync_step_s or {}).items()]
    out.table("WAN recipe (Streaming DiLoCo, yuan)", ["", "value"],
              [["outer sync", outer_sync], *outer_rows,
               ["sync every H", str(recipe.sync_every)], ["local steps", local],
               *[[f"step, {name} local steps (s)", f"{step:.4g}"] for name, step in steps.items() if len(steps) > 1],
               ["fragments P", str(recipe.fragments)],
               ["delay tau", str(recipe.delay)], ["mix alpha", f"{recipe.mix:g}"],
               ["landing / warm-up steps", f"{recipe.landing} / {recipe.warmup}"], ["outer codec", recipe.codec],
               ["moment sync", "off" if not recipe.sync_moments else "every sync" if recipe.moment_syncs is None
                else f"each fragment's first {recipe.moment_syncs} syncs"],
               ["outer lr / momentum", f"{recipe.outer_lr:g} / {recipe.outer_momentum:g}"],
               ["one fragment's exchange (s)", f"{recipe.sync_s:.3f}"],
               ["compute per step, busiest (s)", f"{recipe.compute_s:.4g}"],
               ["predicted step (s)", f"{recipe.step_s:.4g}"],
               *[[f"compute fraction {name}", f"{f:.3f}"] for name, f in zip(labels, fractions)]])

