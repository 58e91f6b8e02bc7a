"""What `bench wan` runs: its rows (`DEFAULT_ROWS`, one line each), its settings and a trained row's result.

Kept apart from geotrain.bench.wan (the runner) so that the row runners (wan.run_row, the torchft row
of geotrain.bench.wan_torchft, the planner's recipe row of geotrain.bench.wan_recipe) share them
without importing each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geotrain.cost.codec_choice import DEFAULT_POLICY
from geotrain.errors import GeotrainError

BENCH_CLUSTERS = Path(__file__).parent / "data"
WAN_CLUSTER_NAME = "wan-4x1"  # the benches' default --cluster, as a user types it
WAN_CLUSTER = str(BENCH_CLUSTERS / f"{WAN_CLUSTER_NAME}.yaml")


def bench_cluster(name: str) -> str:
    """A --cluster value as a path: the bench's own clusters by name (wan-4x1, wan-4x2), else as given
    (a file or a geotrain preset)."""
    own = BENCH_CLUSTERS / f"{name}.yaml"
    return str(own) if "/" not in name and own.is_file() else name


class WanBenchError(GeotrainError, ValueError):
    """A bench option that cannot make a run."""


@dataclass(frozen=True)
class WanRow:
    """One way to train: placement ("naive" | "planned"), flat codecs, or the planner's choice
    (`plan_codecs`, under `policy`), plus RuntimeConfig fields in `options` (a row whose fields this
    geotrain's RuntimeConfig lacks is skipped and listed as such)."""

    label: str
    placement: str = "planned"
    dp_codec: str = "none"
    pp_codec: str = "none"
    plan_codecs: bool = False
    policy: str | None = None  # the planner's codec policy (None: the bench's --codec-policy)
    options: tuple[tuple[str, Any], ...] = ()
    free_links: bool = False  # train on the cluster with every link free (the limit row)
    engine: str = "geotrain"  # "torchft": torchft's DiLoCo, unmodified (bench.wan_torchft; options are its settings)
    recipe: bool = False  # run what the planner's WAN recipe chooses (bench.wan_recipe: layout, H, P, tau, codec;
    # options: the planner's, bench.wan_recipe.RECIPE_OPTIONS)

    @property
    def sync_every(self) -> int:
        """Steps per DP synchronisation (the `sync_every` option of local SGD; 1 without it)."""
        return int(dict(self.options).get("sync_every") or 1)

    @property
    def sync_delay(self) -> int:
        """Steps a sync lands after it starts (the `sync_delay` option, tau; 0 without it)."""
        return int(dict(self.options).get("sync_delay") or 0)

    @property
    def delayed_gradients(self) -> bool:
        """Every step's gradients applied tau > 0 steps later (sync_delay without sync_every: geotrain.sync.delayed)."""
        return self.sync_every == 1 and self.sync_delay > 0


LOCAL_SGD_5 = (("sync_every", 5), ("outer_lr", 1.0), ("outer_momentum", 0.0))
"""Local SGD: AdamW inside each replica, parameters averaged every 5 steps (outer lr 1, no momentum)."""

DEFAULT_ROWS: tuple[WanRow, ...] = (
    WanRow("DDP baseline (naive, fp32)", placement="naive"),
    WanRow("planned, fp32"),
    WanRow("planned + sign+EF", dp_codec="sign"),
    WanRow("planned + powersgd", dp_codec="powersgd"),
    WanRow("planned + int8-block dp (EF) + fp16 pp", dp_codec="int8-block", pp_codec="fp16"),
    WanRow("planned + 1-bit Adam", options=(("optimizer", "onebit-adam"),)),
    WanRow("planned + hierarchical sign+EF", dp_codec="sign", options=(("dp_hierarchical", True),)),
    WanRow("planned + hierarchical int8-block+EF", dp_codec="int8-block", options=(("dp_hierarchical", True),)),
    WanRow("planned + planner codecs (policy dp=sign)", plan_codecs=True, policy="dp=sign,pp=fp16"),
    WanRow("planned + planner codecs (policy dp=int8-block)", plan_codecs=True),
    WanRow("planned + local SGD H=5 (outer avg)", options=LOCAL_SGD_5),
    WanRow("planned + DiLoCo H=5 (Nesterov 0.7/0.9)", options=(("sync_every", 5),)),
    WanRow("planned + local SGD H=5 + int8-block+EF outer", dp_codec="int8-block", options=LOCAL_SGD_5),
    WanRow("planned + local SGD H=5, sites as workers (hierarchical, int8-block+EF outer)", dp_codec="int8-block",
           options=(*LOCAL_SGD_5, ("dp_hierarchical", True))),
    # Streaming DiLoCo (geotrain.sync.streaming): one of 4 fragments per sync, int4 outer gradients. tau 0:
    # the bench scores checkpoints, and a sync in flight (tau > 0) cannot be checkpointed
    WanRow("planned + local SGD H=5 P=4 tau=0 int4-block+EF outer (streaming)", dp_codec="int4-block",
           options=(*LOCAL_SGD_5, ("fragments", 4))),
    # DiLoCo's paper settings overshoot over 12 outer steps (effective step lr/(1-m) = 7); 0.7/0.5 (1.4) works
    WanRow("planned + DiLoCo H=5 (Nesterov 0.7/0.5)", options=(("sync_every", 5), ("outer_momentum", 0.5))),
    # moment sync "auto": priced with and without, the sooner to the target (cost.wan_recipe.choose_recipe)
    WanRow("planned + planner's WAN recipe (auto: H, P, tau, outer codec, moment sync)", recipe=True),
    # torchft's DiLoCo run as its users run it (geotrain.bench.wan_torchft), set as the local SGD H=5 rows
    WanRow("torchft DiLoCo H=5 (outer avg, should_quantize)", engine="torchft",
           options=(*LOCAL_SGD_5, ("should_quantize", True))),
    # eager landing (geotrain.sync.streaming): the exchange hidden behind 2 inner steps, the first 2 syncs blocking
    WanRow("planned + local SGD H=5 + int8-block+EF outer, eager landing tau=2, warm-up 10", dp_codec="int8-block",
           options=(*LOCAL_SGD_5, ("sync_delay", 2), ("sync_landing", "eager"), ("sync_warmup", 10))),
    # delayed gradients (geotrain.sync.delayed): every step's exchange overlapped with the next step; a measured
    # negative result on wan-4x1 (docs/history/wan.md, "Delayed gradients"): one exchange per group at a time,
    # stale AdamW
    WanRow("planned + int8-block+EF gradients every step, overlapped (delay 1)", dp_codec="int8-block",
           options=(("sync_delay", 1),)),
    # moment sync (geotrain.sync.moments): each outer sync also averages the inner AdamW's moments (the first in
    # int4-block with the outer gradients, the second in log-block), in the same collective
    WanRow("planned + local SGD H=5 + int4-block+EF outer + moment sync", dp_codec="int4-block",
           options=(*LOCAL_SGD_5, ("sync_moments", True))),
    WanRow("planned + local SGD H=5 + int4-block+EF outer + moment sync, eager landing tau=2, warm-up 10",
           dp_codec="int4-block",
           options=(*LOCAL_SGD_5, ("sync_moments", True), ("sync_delay", 2), ("sync_landing", "eager"),
                    ("sync_warmup", 10))),
    # what the planner chooses when asked for moment sync (geotrain plan --wan-recipe auto --recipe-sync-moments)
    WanRow("planned + planner's WAN recipe with moment sync (auto: H, P, tau, outer codec)", recipe=True,
           options=(("sync_moments", True),)),
    # the moments in the first sync only (moment_syncs 1): the syncs after it send the int4 outer gradients alone,
    # a third of row 21's bytes (docs/history/wan.md, "Moments in the first sync only")
    WanRow("planned + local SGD H=5 + int4-block+EF outer + moment sync in the first sync, eager landing tau=2, "
           "warm-up 10", dp_codec="int4-block",
           options=(*LOCAL_SGD_5, ("sync_moments", True), ("moment_syncs", 1), ("sync_delay", 2),
                    ("sync_landing", "eager"), ("sync_warmup", 10))),
    # the streaming row's reference (row 14 with one fragment): the same H, codec and blocking syncs, the whole
    # model in every sync; their peak rates compared (docs/history/wan.md, "Peak bandwidth: when streaming cuts it")
    WanRow("planned + local SGD H=5 P=1 tau=0 int4-block+EF outer (blocking: the streaming row's reference)",
           dp_codec="int4-block", options=LOCAL_SGD_5),
    # row 14 with its fragments cut at equal bytes (geotrain.sync.streaming): the 3 tensors the cuts fall in are
    # split by rows, so each sync carries 1/P of the model (whole tensors allow no less than 26.45% here)
    WanRow("planned + local SGD H=5 P=4 tau=0 int4-block+EF outer, fragments cut at equal bytes (streaming)",
           dp_codec="int4-block", options=(*LOCAL_SGD_5, ("fragments", 4), ("fragment_split", "bytes"))),
    WanRow("DDP limit (naive, fp32, zero-cost links)", placement="naive", free_links=True),
)
LIMIT_ROW = len(DEFAULT_ROWS) - 1
"""The index of the limit row in DEFAULT_ROWS (run in every bench, like the baseline, row 0)."""


@dataclass(frozen=True)
class WanBenchConfig:
    """The run: cluster file, step budget, evaluation cadence, target (nats), batch and policy."""

    cluster: str = WAN_CLUSTER
    steps: int = 60
    eval_every: int = 5
    target: float = 2.4
    global_batch: int = 32
    microbatches: int = 4
    lr: float = 3e-3
    seed: int = 0
    time_scale: float = 1e-3
    codec_policy: str = DEFAULT_POLICY
    compute_clock: str = "cpu"
    val_windows: int = 128
    model: str = "tiny"
    rows: tuple[WanRow, ...] = DEFAULT_ROWS
    run_dir: str | None = None
    """Each row's run directory (per-rank metrics, trace, TensorBoard: geotrain.observe) under this folder,
    named by its label; None: none."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.eval_every < 1:
            raise WanBenchError(f"--steps and --eval-every must be >= 1, got {self.steps}, {self.eval_every}")
        if not self.time_scale > 0 or not math.isfinite(self.time_scale):
            raise WanBenchError(f"--time-scale must be a finite number > 0 (the emulating backend runs only then), "
                                f"got {self.time_scale}")
        if self.global_batch < 1 or self.microbatches < 1 or self.val_windows < 1:
            raise WanBenchError(f"--global-batch, microbatches and validation windows must be >= 1, got "
                                f"{self.global_batch}, {self.microbatches}, {self.val_windows}")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise WanBenchError(f"--lr must be a finite number > 0, got {self.lr}")
        # A nan target is never reached (every comparison is false): refused, like every non-finite number.
        if not self.target > 0 or not math.isfinite(self.target):
            raise WanBenchError(f"--target must be a finite validation loss > 0 (nats per character), got {self.target}")


@dataclass(frozen=True)
class RowResult:
    """A trained row: evaluation points (steps, emulated seconds, validation loss) and traffic."""

    row: WanRow
    stages: int
    replicas: int
    assignment: list[list[int]]
    codecs: dict[str, list[str]]
    eval_steps: list[int]
    eval_time_s: list[float]
    val_losses: list[float]
    step_time_s: float
    inter_region_bytes: float
    time_to_target_s: float | None
    compute_fraction: float = 0.0
    peak_profile: dict[float, float] = field(default_factory=dict)  # window (s) -> peak Gbit/s (bench.wan_metrics)
    predicted_step_s: float | None = None  # the planner's prediction (the recipe row)
    recipe: dict[str, Any] | None = None  # the planner's WAN recipe (cost.wan_recipe.WanRecipe.to_json)

    @property
    def val_loss(self) -> float:
        return self.val_losses[-1]

    @property
    def peak_inter_region_gbps(self) -> float:
        """The peak inter-region rate over 1 s windows (0 if not measured)."""
        return self.peak_profile.get(1.0, 0.0)
