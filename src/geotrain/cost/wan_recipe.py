"""The WAN recipe: sync period H, fragments P, delay tau and outer codec of Streaming DiLoCo, chosen by cost.

Cost (seconds; docs/history/wan.md "The WAN recipe"). A sync of one fragment exchanges 1/P of the model's
outer gradients through the codec: a gathered codec (int8/int4/int2-block) as the runtime's reducer
runs it, the faster of gloo's ring all-gather and one direct all-to-all round for that payload on the
DP group's links (geotrain.comm.gather: the same rule chooses at run time); a summable one (none) by
the "yuan" DP term of its bytes:

    T_frag(P, codec) = gather seconds (payload = values / P x the codec's bytes per value), or yuan's dp_s
    exposed          = max(0, T_frag - tau x compute_s)        (hidden behind tau inner steps' compute)
    step_s           = max(compute_s + pp_s + exposed x P / H, T_frag x P / H)
                       (a fragment syncs every H / P steps; one exchange at a time per DP group, so the
                       P exchanges of a period need P x T_frag of the H steps' time)
                       + WARMUP_PERIODS x P x min(T_frag, tau x compute_s) / total_steps
                       (eager landing: the warm-up's P x WARMUP_PERIODS syncs block, so what the
                       overlap hides later is paid there, spread over the run; with total_steps only)

so the bytes per step are fragment bytes / (H / P), and P > 1 adds P - 1 latencies per period while
cutting the peak bandwidth by P. With the outer codec's CPU priced (`codec_s_per_value`, measured on this
machine by geotrain.cost.codec_cpu: `plan --recipe-measure-codecs`, and bench wan's recipe rows) step_s
adds it, values / H per step: the encoding at a sync's start and the decoding where it lands run on the
training thread and hide behind nothing. Moment sync (`sync_moments`, geotrain.sync.moments) adds AdamW's
two moments (the first through the outer codec, the second through log-block) to the payload and the codec
work of each fragment's first RECIPE_MOMENT_SYNCS syncs only (the recipe's `moment_syncs`: measured as good
as moments in every sync, docs/history/diloco.md), so the steady step is the plain one and

    + RECIPE_MOMENT_SYNCS x P x (T_frag with moments - T_frag + the moments' codec CPU) / total_steps

spread over the run (with total_steps only; charged in full even where the sync overlaps compute). Delayed gradients (every step's gradient exchange landing tau steps
later, geotrain.sync.delayed) are the case H = P = 1 (`delayed_gradients_step_seconds`).

Replicas of different speeds (compute_s one per replica; geotrain.cost.local_steps): the period is paced by the
busiest replica, step_s = max(max_r (n_r c_r + P x max(0, T_frag - tau c_r)) / H + pp_s, T_frag x P / H), with
n_r = H ("equal" local steps) or R x H shared by speed ("adaptive": one fragment, tau up to
local_steps.ADAPTIVE_MAX_DELAY); `compute_s` above is then the busiest replica's max_r n_r c_r / H.
`choose_local_steps` runs the rule below for both schedules and keeps the sooner to the target (ties: equal).

Quality (cost.convergence): a setting is charged for the steps it needs to the target against per-step fp32
data parallelism's, `convergence.factor`: f_sync (H, replicas), f_codec, f_local (adaptive steps), f_stale (a
sync that lands tau steps late, mixed in with alpha, drops (1 - alpha) x tau of the period's H steps of
progress: 1 / (1 - (1 - alpha) tau / H); measured on bench wan, wan-4x1, H=5, P=4, tau=2, alpha 0.5: the target
at step 37 against the blocking row's 30, 1.23x, the formula says 1.25; docs/history/wan.md), moment sync,
async staleness, and eager landing's tau steps (the sync that first holds the target lands tau steps after its
period). The rule ranks settings by predicted time to target: step_s x steps_to_target, i.e. step_s x factor per
step of T0 (`target_steps`: per-step DP's steps to the target, measured; default the run's length). Without
the charge an overlapped sync looks free, and the rule chose tau = 2 rows that reached the target later than the
blocking one. With few outer steps (a run of fewer than PAPER_OUTER_STEPS of them) the mix factor is not enough:
every delayed sync measured on bench wan without an overlap warm-up (12 outer steps; mix 0, 0.5 and eager
landing, P = 1 and 4, tau = 1 and 2) needed 1.2x-1.7x the blocking row's steps to the target, so there the rule
keeps every mixed sync blocking.

Eager landing with an overlap warm-up (geotrain.sync.streaming: the first WARMUP_PERIODS outer syncs
block, later ones land eagerly) costs no steps but its landing: measured on bench wan it reaches the target in
the blocking row's outer period (tau steps later: when the sync lands) and ends within 0.01 nats of it. It is
the rule's default (`landing="eager"`); `landing="mix"` gives the mix rule with its charge. Without the warm-up
(`warmup` 0) eager landing is charged cost.convergence's COLD_EAGER_FACTOR (equal steps on bench wan: 1.2x-1.6x
the steps; adaptive steps on bench hetero: none), and saves the warm-up's blocking syncs; the rule prices both.

Time to target (cost.convergence): steps_to_target x the steady step (compute, the exposed exchange and the codec
CPU) + the one-offs, which come early in the run, before the target: the warm-up's blocking syncs and the moment
syncs' extra, in full (`step_s` spreads them over the run instead).

The rule (`choose_recipe`), tolerance e (default 0.02); "time to target" is step_s x factor (cost.convergence),
the smallest over every H, tau, codec and P the rule may choose:
1. H: the smallest H in `sync_every_choices` (fewest local steps: the lowest loss past the target) with a
   setting within (1 + e) of the least time to target. With `total_steps`, H is capped so that the run has at
   least MIN_OUTER_STEPS outer steps (fewer outer steps lost quality in bench wan: docs/history/wan.md). (Until
   2026-12-06 the rule took the smallest H whose fastest step computed 95% of the time, by step time: on bench
   hetero it chose H 2, whose step was 21% longer than H 5's for no fewer steps to the target.)
2. tau: the smallest delay (a landed sync is staler with each step) within (1 + e) at that H; with the mix rule,
   0 with fewer than PAPER_OUTER_STEPS outer steps (above);
3. codec: the best-quality rung of OUTER_LADDER (down to `floor`) within (1 + e) at that tau. Delay
   before codec (until 2026-12-05 the codec came first): on bench wan a step of delay cost more than
   int4 against int8 (eager int8: +0.041 nats at tau 2, +0.046 at 3; with moment sync, int4-block at tau 2
   +0.016, int8-block at tau 4 +0.039; int4-block and exact means end within 0.001).
4. P: the largest fragment count within (1 + e) of it (lowest peak bandwidth); then the warm-up if within.
5. tau > 0: eager landing after WARMUP_PERIODS blocking periods (landing "eager"), or mix alpha 0.5
   (landing "mix"; Streaming DiLoCo's; alpha 0 drops the overlapped steps' progress).
6. outer optimizer: averaging (lr 1, momentum 0) under PAPER_OUTER_STEPS outer steps, else DiLoCo's
   Nesterov 0.7 / 0.9 (measured: 0.7/0.9 over 12 outer steps misses bench wan's target; docs/history/wan.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.async_outer import STALENESS_BOUND, async_outer_price
from geotrain.cost.codec_choice import codec_link_bytes
from geotrain.cost.convergence import Convergence, convergence, staleness_factor
from geotrain.cost.local_steps import (ADAPTIVE_MAX_DELAY, period_local_steps, period_step_seconds,
                                       replica_compute_per_step, replica_seconds)
from geotrain.cost.traffic import traffic_of_job
from geotrain.cost.yuan import YuanCostModel
from geotrain.errors import GeotrainError, shown
from geotrain.job import Job

OUTER_LADDER = ("none", "int8-block", "int4-block", "int2-block")
"""Outer-gradient codecs, best quality first (error feedback on; docs/history/diloco.md has their bytes)."""
DEFAULT_CODEC_FLOOR = "int4-block"
"""The lowest rung the rule may choose unless told otherwise (`plan --recipe-codec-floor`)."""
SYNC_EVERY_CHOICES = (2, 5, 10, 20, 50, 100)
MIN_OUTER_STEPS = 12
PAPER_OUTER_STEPS = 100
AVERAGING = (1.0, 0.0)
DILOCO_PAPER = (0.7, 0.9)
OVERLAP_MIX = 0.5
WARMUP_PERIODS = 2
"""Eager landing's overlap warm-up: the first outer periods' syncs block (docs/history/wan.md, "Eager landing")."""
RECIPE_MOMENT_SYNCS = 1
"""With moment sync, each fragment's first syncs that carry the moments (docs/history/wan.md, "Moments in the first
sync only": on bench wan as good as every sync on 3 seeds, and the cheapest)."""
RECIPE_LANDINGS = ("eager", "mix")


class WanRecipeError(GeotrainError, ValueError):
    """A recipe setting or a plan's "wan_recipe" object that cannot be used."""


@dataclass(frozen=True)
class WanRecipe:
    """Streaming DiLoCo settings and the seconds per step the cost model predicts for them."""

    sync_every: int
    fragments: int
    delay: int
    mix: float  # Streaming DiLoCo's alpha: 0.5 (the paper's) when a sync lands late, else 0 (blocking DiLoCo)
    codec: str
    outer_lr: float
    outer_momentum: float
    step_s: float
    compute_s: float
    sync_s: float  # one fragment's exchange (T_frag)
    landing: str = "mix"  # how a late sync lands (geotrain.sync.streaming): "mix" (with mix) or "eager"
    warmup: int = 0  # syncs started before this step block (the overlap warm-up)
    sync_moments: bool = False  # the first syncs also average AdamW's moments (geotrain.sync.moments)
    moment_syncs: int | None = None  # with sync_moments: each fragment's first syncs that carry them (None: all)
    local_steps: str = "equal"  # inner steps per period: H everywhere, or "adaptive" (cost.local_steps)
    replica_steps: tuple[int, ...] | None = None  # n_r per replica per period, as priced (adaptive: re-measured)
    replica_compute_s: tuple[float, ...] | None = None  # per replica, compute seconds per step (n_r c_r / H)
    local_steps_step_s: dict[str, float] | None = None  # choose_local_steps: each schedule's predicted step_s
    outer_sync: str = "sync"  # "async": asynchronous outer updates (cost.async_outer; fp32, one replica's model each)
    convergence: dict[str, Any] | None = None  # cost.convergence's record: steps and seconds to the target, factors
    outer_sync_step_s: dict[str, float] | None = None  # choose_local_steps with async: each one's predicted step_s
    outer_sync_charged_s: dict[str, float] | None = None  # the same, times each one's convergence factor (the rule's)

    @property
    def compute_fraction(self) -> float:
        """The busiest replica's compute seconds over the step's."""
        return self.compute_s / self.step_s if self.step_s > 0 else 1.0

    @property
    def async_staleness_factor(self) -> float | None:
        """Asynchronous updates: their time to a loss against fresh updates (cost.async_outer), as charged."""
        return None if self.outer_sync == "sync" or self.convergence is None else self.convergence["async"]

    @property
    def time_to_target_s(self) -> float | None:
        """Predicted seconds to the target (cost.convergence; None where T0 is unknown)."""
        return None if self.convergence is None else self.convergence["time_to_target_s"]

    @property
    def replica_compute_fraction(self) -> tuple[float, ...] | None:
        """Per replica: its compute seconds over the step's (None: priced with one compute for all)."""
        if self.replica_compute_s is None:
            return None
        return tuple(c / self.step_s if self.step_s > 0 else 1.0 for c in self.replica_compute_s)

    def to_json(self) -> dict[str, Any]:
        """The plan's "wan_recipe" object (`geotrain train --plan` runs it)."""
        fractions = self.replica_compute_fraction
        return {"version": 1, **dataclasses.asdict(self), "compute_fraction": self.compute_fraction,
                "replica_compute_fraction": None if fractions is None else list(fractions)}

    @classmethod
    def from_json(cls, doc: Any, source: str = "<plan>") -> WanRecipe:
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise WanRecipeError(f"{source}: wan_recipe must be an object with version 1, got {shown(doc)}")
        try:  # fields with a default (landing, warmup) may be absent: plans written before them
            return cls(**{f.name: tuple(doc[f.name]) if isinstance(doc[f.name], list) else doc[f.name]
                          for f in dataclasses.fields(cls) if f.name in doc or f.default is dataclasses.MISSING})
        except KeyError as missing:
            raise WanRecipeError(f"{source}: wan_recipe.{missing.args[0]} is missing") from None

    def runtime_settings(self, shards: int = 1) -> dict[str, dict[str, Any]]:
        """RuntimeConfig sections (optim, comm) that run this recipe. With P > 1 the fragments are cut at equal
        bytes (geotrain.sync.streaming), as the cost model prices them: 1/P of the model each; on a plan of K > 1
        `shards` per slot between tensors ("layers": a row cut would fall inside another rank's shard), which is
        1/P of the model up to one tensor."""
        split = "bytes" if shards == 1 else "layers"
        return {"optim": {"sync_every": self.sync_every, "fragments": self.fragments,
                          **({"fragment_split": split} if self.fragments > 1 else {}), "sync_delay": self.delay,
                          "sync_mix": self.mix, "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum,
                          **({"sync_landing": self.landing, "sync_warmup": self.warmup}
                             if self.landing != "mix" else {}),
                          **({"sync_moments": True} if self.sync_moments else {}),
                          **({"moment_syncs": self.moment_syncs} if self.moment_syncs is not None else {}),
                          **({"local_steps": self.local_steps} if self.local_steps != "equal" else {}),
                          **({"outer_sync": self.outer_sync} if self.outer_sync != "sync" else {})},
                "comm": {"dp_codec": self.codec}}


def outer_ladder(floor: str = DEFAULT_CODEC_FLOOR) -> tuple[str, ...]:
    """The rungs of OUTER_LADDER the rule may choose: from the best down to `floor` (one of them)."""
    return OUTER_LADDER[: OUTER_LADDER.index(floor) + 1]


def fragment_sync_seconds(cluster: Cluster, job: Job, assignment: np.ndarray, fragments: int, codec: str,
                          sync_moments: bool = False) -> float:
    """T_frag, slowest stage: a gathered codec's exchange of one fragment (1/P of the model) as the runtime
    runs it (geotrain.comm.gather: the faster of the ring and the direct all-to-all for that payload on
    the DP group's links); a summable codec's all-reduce by yuan's DP term of the fragment's bytes.
    `sync_moments` (geotrain.sync.moments): AdamW's two fp32 moments travel in the same gathered payload,
    the first through `codec`, the second through its own codec (sync.moments.second_moment_codec)."""
    from geotrain.codecs import CodecSpec  # torch-backed: imported only when codecs are priced
    from geotrain.comm import reducer_traits
    from geotrain.comm.gather import GatherLinks
    from geotrain.sync.moments import second_moment_codec

    stages, replicas = assignment.shape
    spec = CodecSpec.parse(codec)
    if reducer_traits(spec).gathered or sync_moments:
        values = job.dp_bytes(stages) / job.bytes_per_value / fragments
        codec_ = spec.build()
        per_value = codec_.bytes_per_value(job.hidden, job.bytes_per_value)
        if sync_moments:  # the moments are fp32 whatever the parameters' width
            per_value += (codec_.bytes_per_value(job.hidden, 4.0)
                          + second_moment_codec(spec).build().bytes_per_value(job.hidden, 4.0))
        return max(GatherLinks.of_cluster(cluster, row).best_seconds(values * per_value) for row in assignment)
    traffic = traffic_of_job(job, stages, replicas, codec_link_bytes(codec, job, "dp", replicas))
    traffic = dataclasses.replace(traffic, dp_bytes=tuple(b / fragments for b in traffic.dp_bytes))
    return float(YuanCostModel(cluster, traffic).stage_dp_seconds(assignment).max())


def recipe_step_seconds(sync_s: float, compute_s: float, pp_s: float, sync_every: int, fragments: int,
                        delay: int) -> float:
    """step_s of the module doc: compute + pipeline + the exposed part of each sync, amortised, and at
    least the DP group's occupancy (one exchange at a time per group: P exchanges per H steps)."""
    return period_step_seconds(sync_s, compute_s, (sync_every,), sync_every, fragments, delay, pp_s)


def warmup_seconds(sync_s: float, compute_s: float, fragments: int, delay: int) -> float:
    """Seconds eager landing's blocking warm-up adds to a run (module doc): its WARMUP_PERIODS x P fragment syncs
    block, each paying the part of T_frag that tau steps would have hidden. 0 without a delay."""
    return WARMUP_PERIODS * fragments * min(sync_s, delay * compute_s) if delay > 0 else 0.0


def warmup_step_seconds(sync_s: float, compute_s: float, fragments: int, delay: int, total_steps: int | None) -> float:
    """warmup_seconds spread over a run of `total_steps` (0 without a known run length)."""
    return warmup_seconds(sync_s, compute_s, fragments, delay) / total_steps if total_steps else 0.0


def moment_seconds(sync_s: float, moment_sync_s: float, moment_cpu_s: float, fragments: int) -> float:
    """Seconds moment sync in each fragment's first RECIPE_MOMENT_SYNCS syncs adds to a run (module doc): each of
    those P x RECIPE_MOMENT_SYNCS syncs takes `moment_sync_s` instead of `sync_s` of link time plus `moment_cpu_s`
    of codec CPU for the moments."""
    return RECIPE_MOMENT_SYNCS * fragments * (max(0.0, moment_sync_s - sync_s) + moment_cpu_s)


def moment_step_seconds(sync_s: float, moment_sync_s: float, moment_cpu_s: float, fragments: int,
                        total_steps: int | None) -> float:
    """moment_seconds spread over a run of `total_steps` (0 without a known run length)."""
    return moment_seconds(sync_s, moment_sync_s, moment_cpu_s, fragments) / total_steps if total_steps else 0.0


def delayed_gradients_step_seconds(cluster: Cluster, job: Job, assignment: Any, compute_s: float, codec: str,
                                   delay: int, pp_s: float = 0.0) -> float:
    """Seconds per step of delayed gradients (geotrain.sync.delayed: the whole model's gradients exchanged every
    step through `codec`, each exchange hidden behind `delay` steps of compute): the module doc's step_s with
    H = P = 1, i.e. max(compute + pp + max(0, T - tau x compute), T) for T the whole model's exchange."""
    assignment = np.asarray(assignment, dtype=np.int64)
    return recipe_step_seconds(fragment_sync_seconds(cluster, job, assignment, 1, codec), compute_s, pp_s, 1, 1, delay)


def setting_step_seconds(sync_s: float, compute_s: float | Sequence[float], local_steps: Sequence[int],
                         sync_every: int, fragments: int, delay: int, *, pp_s: float = 0.0, codec_cpu_s: float = 0.0,
                         landing: str = "eager", total_steps: int | None = None, moments_s: float = 0.0) -> float:
    """One setting's predicted seconds per step (module doc): the steady step over the replicas
    (local_steps.period_step_seconds: `compute_s` and inner steps per period per replica), one sync's codec CPU
    (`codec_cpu_s`, encoding and decoding the synchronised values) over H, eager landing's blocking warm-up and
    the moment syncs' extra (`moments_s`, per step) spread over the run."""
    pace = float(replica_compute_per_step(compute_s, local_steps, sync_every).max())
    warmup = warmup_step_seconds(sync_s, pace, fragments, delay, total_steps) if landing == "eager" else 0.0
    steady = period_step_seconds(sync_s, compute_s, local_steps, sync_every, fragments, delay, pp_s)
    return steady + codec_cpu_s / sync_every + warmup + moments_s


def choose_recipe(cluster: Cluster, job: Job, assignment: Any, compute_s: float | Sequence[float], *,
                  pp_s: float = 0.0, total_steps: int | None = None, max_delay: int | None = None,
                  max_fragments: int = 8, floor: str = DEFAULT_CODEC_FLOOR, tolerance: float = 0.02,
                  sync_every_choices: Sequence[int] = SYNC_EVERY_CHOICES, landing: str = "eager",
                  sync_moments: bool | str = False, codec_s_per_value: Mapping[str, float] | None = None,
                  moment_codec_s_per_value: Mapping[str, float] | None = None,
                  local_steps: str = "equal", target_steps: float | None = None) -> WanRecipe:
    """The recipe of the module doc's rule for `assignment[s][r]`; `compute_s` per step (s, > 0): one for every
    replica, or one per replica (replica order; cost.local_steps prices them);
    `max_delay` caps tau (None: H - 1; 0 where a sync may not be in flight, e.g. at checkpoints); `landing`
    of a late sync: "eager" (after a blocking warm-up) or "mix" (alpha 0.5, charged); `sync_moments`: AdamW's
    moments in each fragment's first RECIPE_MOMENT_SYNCS syncs, priced (True), not (False), or "auto": the recipe
    with and the one without, the sooner to the target (ties: without);
    `codec_s_per_value`: CPU seconds per synchronised value of one sync's codec work, by outer
    codec (geotrain.cost.codec_cpu, measured; None or a codec missing: not priced);
    `moment_codec_s_per_value`: the same for a sync that carries the moments; `local_steps`: "equal" or
    "adaptive" (one fragment; tau up to local_steps.ADAPTIVE_MAX_DELAY); `target_steps`: per-step fp32 data
    parallelism's steps to the target (cost.convergence's T0; None: `total_steps`)."""
    if landing not in RECIPE_LANDINGS:
        raise WanRecipeError(f"recipe landing must be one of {', '.join(RECIPE_LANDINGS)}, got {shown(landing)}")
    if floor not in OUTER_LADDER:
        raise WanRecipeError(f"--recipe-codec-floor must be one of {', '.join(OUTER_LADDER)}, got {shown(floor)}")
    if np.ndim(compute_s) == 0 and (not compute_s > 0 or not np.isfinite(compute_s)):
        raise WanRecipeError(f"--compute-s: compute seconds per step must be a finite number > 0, got {shown(compute_s)}")
    if sync_moments == "auto":
        both = [choose_recipe(cluster, job, assignment, compute_s, pp_s=pp_s, total_steps=total_steps,
                              max_delay=max_delay, max_fragments=max_fragments, floor=floor, tolerance=tolerance,
                              sync_every_choices=sync_every_choices, landing=landing, sync_moments=moments,
                              codec_s_per_value=codec_s_per_value, moment_codec_s_per_value=moment_codec_s_per_value,
                              local_steps=local_steps, target_steps=target_steps) for moments in (False, True)]
        return min(both, key=charged_step_seconds)
    if not isinstance(sync_moments, bool):
        raise WanRecipeError(f"recipe moment sync must be true, false or auto, got {shown(sync_moments)}")
    assignment = np.asarray(assignment, dtype=np.int64)
    replicas = int(assignment.shape[1])
    target_steps = total_steps if target_steps is None else target_steps
    compute = replica_seconds(compute_s)
    compute = np.full(replicas, compute[0]) if compute.size == 1 else compute
    if compute.size != replicas:
        raise WanRecipeError(f"compute seconds per step: one, or one per replica ({replicas}), got {compute.size}")
    adaptive = local_steps == "adaptive"
    if adaptive:  # the runtime's adaptive steps: one fragment, tau as far as it runs them
        max_fragments = 1
        if ADAPTIVE_MAX_DELAY is not None:
            max_delay = ADAPTIVE_MAX_DELAY if max_delay is None else min(max_delay, ADAPTIVE_MAX_DELAY)
    choices = sorted(h for h in sync_every_choices
                     if total_steps is None or h * MIN_OUTER_STEPS <= total_steps) or [min(sync_every_choices)]
    codecs = outer_ladder(floor)
    sync = {(p, c): fragment_sync_seconds(cluster, job, assignment, p, c)
            for p in range(1, max_fragments + 1) for c in codecs}
    moment_sync = {key: fragment_sync_seconds(cluster, job, assignment, *key, sync_moments=True)
                   for key in sync} if sync_moments else sync
    values = job.dp_bytes(assignment.shape[0]) / job.bytes_per_value  # one stage's, synchronised per period
    cpu_per_value = dict(codec_s_per_value or {})
    moment_cpu_per_value = dict(moment_codec_s_per_value or {}) if sync_moments else {}
    steps = {h: period_local_steps(compute, h, local_steps) for h in choices}
    per_step = {h: replica_compute_per_step(compute, steps[h], h) for h in choices}
    pace = {h: float(per_step[h].max()) for h in choices}  # the busiest replica's compute per step

    def step_seconds(p: int, c: str, h: int, t: int, warm: bool) -> tuple[float, float]:
        """(steady seconds per step, one-off seconds of the run): the steady step with the codecs' CPU per step
        (each of the P fragment syncs of a period encodes and decodes values / P); the eager warm-up's blocking
        syncs (`warm`) and the moment syncs' extra, which come early in the run, before any target."""
        moment_cpu = max(0.0, moment_cpu_per_value.get(c, 0.0) - cpu_per_value.get(c, 0.0)) * values / p
        steady = setting_step_seconds(sync[p, c], compute, steps[h], h, p, t, pp_s=pp_s,
                                      codec_cpu_s=cpu_per_value.get(c, 0.0) * values)
        once = warmup_seconds(sync[p, c], pace[h], p, t) if warm and landing == "eager" else 0.0
        if sync_moments:
            once += moment_seconds(sync[p, c], moment_sync[p, c], moment_cpu, p)
        return steady, once if total_steps else 0.0

    def quality(c: str, h: int, t: int, warm: bool) -> Convergence:
        """cost.convergence's factors of a setting."""
        return convergence(h, replicas, codec=c, delay=t, mix=OVERLAP_MIX if t > 0 else 0.0, landing=landing,
                           warmup=warm, local_steps=steps[h] if adaptive else None, sync_moments=sync_moments,
                           target_steps=target_steps)

    def charged(p: int, c: str, h: int, t: int, warm: bool) -> float:
        """Predicted time to target per step of T0: steady step x convergence factor + the one-offs over T0."""
        steady, once = step_seconds(p, c, h, t, warm)
        return steady * quality(c, h, t, warm).factor + (once / target_steps if target_steps else 0.0)

    def options(h: int) -> list[tuple[float, int, int, int, int, bool, str]]:
        """(time to target per step of T0, H, tau, codec rank, -P, no warm-up, codec) of every setting at H = h."""
        blocking_only = landing == "mix" and total_steps is not None and total_steps // h < PAPER_OUTER_STEPS
        taus = range(0, (0 if blocking_only else h - 1 if max_delay is None else min(max_delay, h - 1)) + 1)
        warmups = (True, False) if landing == "eager" else (True,)
        return [(charged(p, c, h, t, w), h, t, i, -p, not w, c) for i, c in enumerate(codecs)
                for p in range(1, min(max_fragments, h) + 1) for t in taus for w in (warmups if t > 0 else (True,))]

    every = [o for h in choices for o in options(h)]
    limit = min(o[0] for o in every) * (1 + tolerance) * (1 + 1e-12)
    within = [o for o in every if o[0] <= limit]
    h = min(o[1] for o in within)  # 1. fewest local steps
    tau = min(o[2] for o in within if o[1] == h)  # 2. least delay
    codec_rank = min(o[3] for o in within if o[1] == h and o[2] == tau)  # 3. best-quality codec
    _, _, _, _, neg_p, cold, codec = min((o for o in within if o[1] == h and o[2] == tau and o[3] == codec_rank),
                                         key=lambda o: (o[4], o[5]))  # 4. most fragments, 5. with the warm-up
    steady, once = step_seconds(-neg_p, codec, h, tau, not cold)
    step_s = steady + (once / total_steps if total_steps else 0.0)  # predicted over the run, uncharged
    outer = outer_optimizer(h, total_steps)
    eager = tau > 0 and landing == "eager"
    return WanRecipe(h, -neg_p, tau, OVERLAP_MIX if tau > 0 and not eager else 0.0, codec, outer[0], outer[1],
                     step_s, pace[h], sync[-neg_p, codec], "eager" if eager else "mix",
                     WARMUP_PERIODS * h if eager and not cold else 0, sync_moments,
                     RECIPE_MOMENT_SYNCS if sync_moments else None, local_steps,
                     tuple(int(n) for n in steps[h]), tuple(float(c) for c in per_step[h]),
                     convergence=quality(codec, h, tau, not cold).to_json(steady, once))


def outer_optimizer(sync_every: int, total_steps: int | None) -> tuple[float, float]:
    """(outer lr, momentum) of the rule's step 6: averaging under PAPER_OUTER_STEPS outer steps, else DiLoCo's."""
    return AVERAGING if total_steps is not None and total_steps // sync_every < PAPER_OUTER_STEPS else DILOCO_PAPER


def charged_step_seconds(recipe: WanRecipe) -> float:
    """The recipe's predicted step times its convergence factor (cost.convergence: steps to the target over
    per-step DP's): predicted time to target per step of T0, what the rule and layouts rank by."""
    record = recipe.convergence
    if record is not None:
        if record["time_to_target_s"] is not None:
            return record["time_to_target_s"] / record["target_steps"]
        return record["steady_step_s"] * record["factor"]
    if recipe.outer_sync != "sync":
        return recipe.step_s
    return recipe.step_s * staleness_factor(recipe.sync_every, recipe.delay, recipe.mix, recipe.landing)


def async_recipe(cluster: Cluster, job: Job, assignment: Any, replica_compute_s: Sequence[float], sync_every: int,
                 total_steps: int | None = None, target_steps: float | None = None, sync_moments: bool = False
                 ) -> WanRecipe:
    """Asynchronous DiLoCo (flat) with H = `sync_every` inner steps per update, priced by cost.async_outer (a server
    per stage, the stages' parameters split evenly; `sync_moments`: each update also carries AdamW's second
    moments), its steps to the target by cost.convergence (T0 `target_steps`, None: `total_steps`). Its updates
    carry the fp32 model: no codec, no fragments (they add latency and save no bytes: cost.async_outer), no delay."""
    from geotrain.comm.gather import GatherLinks

    assignment = np.asarray(assignment, dtype=np.int64)
    compute = replica_seconds(replica_compute_s)
    stages = int(assignment.shape[0])
    links = [GatherLinks.of_cluster(cluster, row) for row in assignment]
    stage_bytes = [job.dp_bytes(stages) / job.bytes_per_value * 4.0] * stages  # the runtime's wire: flat fp32
    price = async_outer_price(compute, sync_every, stage_bytes, links, STALENESS_BOUND, moments=sync_moments)
    per_step = tuple(f * price.step_s for f in price.compute_fraction)
    outer = outer_optimizer(sync_every, total_steps)
    rate = 1.0 / np.asarray(price.period_s)  # each replica's share of the inner steps, as adaptive steps share them
    quality = convergence(sync_every, int(assignment.shape[1]), async_staleness=price.staleness_factor,
                          local_steps=list(rate.size * sync_every * rate / rate.sum()),
                          target_steps=total_steps if target_steps is None else target_steps)
    return WanRecipe(sync_every, 1, 0, 0.0, "none", outer[0], outer[1], price.step_s, max(per_step), max(price.round_trip_s),
                     sync_moments=sync_moments, replica_compute_s=per_step, outer_sync="async",
                     convergence=quality.to_json(price.step_s, 0.0))


def choose_local_steps(cluster: Cluster, job: Job, assignment: Any, replica_compute_s: Sequence[float],
                       asynchronous: bool = False, **options: Any) -> WanRecipe:
    """choose_recipe with equal local steps and, where the replicas differ in compute (a replica of S > 1 stages
    takes one step count, paced by its slowest stage), with adaptive ones; the sooner to the target wins (ties:
    equal). `asynchronous`: also price asynchronous outer updates at the chosen H (async_recipe: a server per stage,
    moment sync as `options` asks): they replace the synchronous recipe only if they reach the target sooner.
    `replica_compute_s`: compute seconds per step of each replica with equal steps; `options`: choose_recipe's.
    The winner records both schedules' predicted steps (`local_steps_step_s`) and, priced, sync's and async's
    (`outer_sync_step_s`) and their steps times their convergence factors, which decide (`outer_sync_charged_s`)."""
    assignment = np.asarray(assignment, dtype=np.int64)
    compute = replica_seconds(replica_compute_s)
    equal = choose_recipe(cluster, job, assignment, compute, **options)
    best, steps = equal, {"equal": equal.step_s}
    if not np.all(compute == compute[0]):
        adaptive = choose_recipe(cluster, job, assignment, compute, **options, local_steps="adaptive")
        best = adaptive if charged_step_seconds(adaptive) < charged_step_seconds(equal) else equal
        steps["adaptive"] = adaptive.step_s
    best = dataclasses.replace(best, local_steps_step_s=steps)
    if not asynchronous or assignment.shape[1] < 2:
        return best
    candidate = async_recipe(cluster, job, assignment, compute, best.sync_every, options.get("total_steps"),
                             options.get("target_steps"), sync_moments=options.get("sync_moments") is True)
    charged = {"sync": charged_step_seconds(best), "async": charged_step_seconds(candidate)}
    chosen = candidate if charged["async"] < charged["sync"] else best
    return dataclasses.replace(chosen, local_steps_step_s=steps, outer_sync_charged_s=charged,
                               outer_sync_step_s={"sync": best.step_s, "async": candidate.step_s})


def estimated_compute_s(cluster: Cluster, job: Job, assignment: Any, utilisation: float | None = None) -> float:
    """Compute seconds per step of the slowest replica by the "yuan+compute" model (GPU peak x `utilisation`; None:
    DEFAULT_UTILISATION, or a calibration's, cost.calibration)."""
    from geotrain.cost.compute import YuanComputeCostModel

    assignment = np.asarray(assignment, dtype=np.int64)
    stages, replicas = assignment.shape
    model = YuanComputeCostModel.for_job(cluster, job, int(stages), int(replicas),
                                         **({} if utilisation is None else {"utilisation": utilisation}))
    return float(model.replica_compute_seconds(assignment[None]).max())
