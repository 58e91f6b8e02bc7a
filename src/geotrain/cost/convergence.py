"""Steps to a target loss under a synchronisation recipe: the convergence model the WAN recipe is chosen by.

Units: steps (one step = the global batch's samples, as per-step data parallelism takes them; with local SGD R
replicas take H inner steps of their share between syncs). `target_steps` T0: steps per-step fp32 data parallelism
(DDP) takes to the target loss; a measured number (the benches take their limit row's crossing: fp32 DDP on free
links), else the run's length (the target is then the loss DDP reaches at the end of the token budget).

    steps_to_target = T0 x f_sync x f_codec x f_local x f_stale x f_cold x f_moments x f_async + landing
    f_sync   = 1 + SYNC_PERIOD_COST x (H - 1) x (R - 1) / R      (H = 1 or one replica: DDP's own updates)
    f_codec  = CODEC_FACTOR[outer codec]                          (with error feedback)
    f_local  = 1 - ADAPTIVE_GAIN x (1 - H / max_r n_r)             (adaptive local steps: n_r inner steps per period,
                                                                   the fastest replica's share; equal steps: 1)
    f_stale  = 1 / (1 - (1 - alpha) tau / H)                      (a sync mixed in alpha, tau steps late; eager
                                                                   landing and tau = 0: 1)
    f_cold   = COLD_EAGER_FACTOR[equal or adaptive steps] for eager landing without its blocking warm-up, else 1
    f_async  = (the asynchronous updates' staleness factor, cost.async_outer) ** ASYNC_STALENESS_WEIGHT
               (f_local then takes each replica's share of the inner steps, by its update period)
    f_moments = MOMENT_SYNC_FACTOR with moment sync, else 1 (a factor of f_sync's: the moments mend local steps)
    landing  = tau with eager landing: the sync that first holds the target lands tau steps after its period

time_to_target_s = steps_to_target x the predicted steady seconds per step + the one-offs that come before the
target (cost.wan_recipe: the warm-up's blocking syncs, the moment syncs' extra). The rule compares settings by
time_to_target_s / T0, which needs no T0 but for the landing's tau / T0 and the one-offs (dropped where neither T0
nor the run's length is known).

Where the constants come from (fitted 2026-12-06 from the steps at which each row's validation loss crosses the
target, interpolated between evaluations (`crossing_step`), over the limit row's; data, commands and the fit:
docs/history/convergence.md):
- SYNC_PERIOD_COST: `bench hetero` (hetero-4x1, R = 4, target 2.5), every row scored every period: equal H 5,
  blocking, int8-block 19.31 steps against DDP's 17.04: f_sync(5, 4) = 1.13; `bench wan` (wan-4x1, target 2.4,
  `--rows 12,16,18,20,21,22,23,24`): H 5 blocking 28.45 against 25.08, 1.13 again;
- CODEC_FACTOR: `bench wan` rows 12 and 24 (int8-block, int4-block, H 5) cross at 28.45 and 28.43 and end at the
  same loss to 4 digits; int2-block is not measured (its factor 1 is a guess the default floor, int4-block,
  keeps the rule from using);
- MOMENT_SYNC_FACTOR: `bench wan` rows 20-23 against 24 and 18 (moments in the first sync, blocking and eager):
  the target at step 25 against 30 (docs/results/bench-wan.md, 2026-12-05 and 12-06);
- ADAPTIVE_GAIN: `bench hetero`, adaptive H 5 tau 2 (10 / 4 / 4 / 2 inner steps) and H 2 tau 1 (4 / 2 / 1 / 1):
  0.61 and 0.68 of the equal steps' count (A 0.78 and 0.64); the milder spread (1.36x,
  examples/clusters/mild-gpus-4x1.yaml) measured no gain, so the factor is this bench's;
- ASYNC_STALENESS_WEIGHT: `bench hetero`'s async row (H 5, bound 8) crossed at 16.6 and 15.0 steps (two runs),
  against cost.async_outer's factor 1.63: W 0.71 and 0.5;
- COLD_EAGER_FACTOR: equal steps, bench wan without the warm-up (docs/history/wan.md, "Run 1": steps 41-47 less
  tau against 30); adaptive steps, bench hetero: the same period with and without it;
- f_stale: bench wan, H = 5, P = 4, tau = 2, alpha 0.5: 1.23x measured, 1.25 by the formula (docs/history/wan.md).
Measured on one tiny GPT at one target each: the factors are its. For another model, a short run of the user's
gives T0 (`target_steps`), and these constants can be refitted the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from geotrain.errors import GeotrainError, shown

SYNC_PERIOD_COST = 0.044
"""f_sync's slope per local step between syncs, at R -> infinity (bench hetero and bench wan, H = 5; module doc)."""
CODEC_FACTOR = {"none": 1.0, "int8-block": 1.0, "int4-block": 1.0, "int2-block": 1.0}
"""Steps to the target through each outer codec (error feedback on) against exact outer gradients (module doc)."""
ADAPTIVE_GAIN = 0.7
"""f_local's slope in the fastest replica's extra share of a period (bench hetero; module doc)."""
MOMENT_SYNC_FACTOR = 25 / 30
"""Steps to the target with AdamW's moments averaged in the first sync (bench wan: step 25 against 30)."""
COLD_EAGER_FACTOR = {"equal": 1.4, "adaptive": 1.0}
"""Steps to the target of eager landing without the blocking warm-up, by local steps (module doc)."""
ASYNC_STALENESS_WEIGHT = 0.6
"""The power of cost.async_outer's staleness factor that fits bench hetero's async row (module doc)."""


class ConvergenceError(GeotrainError, ValueError):
    """Settings the convergence model cannot price."""


@dataclass(frozen=True)
class Convergence:
    """A recipe's predicted steps to the target: the factors of the module doc and T0 (None: unknown)."""

    sync: float = 1.0
    codec: float = 1.0
    local: float = 1.0
    stale: float = 1.0
    cold: float = 1.0
    moments: float = 1.0
    asynchronous: float = 1.0
    landing_steps: float = 0.0
    target_steps: float | None = None

    @property
    def product(self) -> float:
        """The multiplicative factors together."""
        return self.sync * self.codec * self.local * self.stale * self.cold * self.moments * self.asynchronous

    @property
    def factor(self) -> float:
        """steps_to_target / T0 (the landing over T0; without T0 the factors alone): what the rule weighs."""
        return self.product + (self.landing_steps / self.target_steps if self.target_steps else 0.0)

    @property
    def steps(self) -> float | None:
        """Predicted steps to the target (None without T0)."""
        return None if not self.target_steps else self.target_steps * self.product + self.landing_steps

    def time_to_target_s(self, step_s: float, once_s: float = 0.0) -> float | None:
        """Predicted seconds to the target at `step_s` seconds per steady step, plus `once_s` paid early in the run
        (a blocking warm-up, moment syncs); None without T0."""
        steps = self.steps
        return None if steps is None else steps * step_s + once_s

    def to_json(self, step_s: float, once_s: float = 0.0) -> dict[str, Any]:
        """The plan's record: T0, the predicted steps and seconds to the target (`step_s` per steady step, `once_s`
        once), the factor and each factor."""
        return {"target_steps": self.target_steps, "steps_to_target": self.steps,
                "time_to_target_s": self.time_to_target_s(step_s, once_s), "steady_step_s": step_s,
                "once_s": once_s, "factor": self.factor, "sync": self.sync, "codec": self.codec,
                "local": self.local, "stale": self.stale, "cold": self.cold, "moments": self.moments,
                "async": self.asynchronous, "landing_steps": self.landing_steps}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Convergence:
        return cls(doc["sync"], doc["codec"], doc["local"], doc["stale"], doc["cold"], doc["moments"], doc["async"],
                   doc["landing_steps"], doc["target_steps"])


def staleness_factor(sync_every: int, delay: int, mix: float, landing: str = "mix") -> float:
    """f_stale: steps to a loss relative to blocking DiLoCo's, 1 / (1 - (1 - mix) tau / H) for the mix rule;
    1 at tau = 0 and for eager landing (after its warm-up; its landing is counted in steps instead)."""
    if landing == "eager" or delay == 0:
        return 1.0
    return 1.0 / (1.0 - (1.0 - mix) * delay / sync_every)


def sync_factor(sync_every: int, replicas: int) -> float:
    """f_sync: steps to the target with a sync every H steps of R replicas against per-step data parallelism."""
    return 1.0 + SYNC_PERIOD_COST * (sync_every - 1) * (replicas - 1) / replicas


def adaptive_factor(sync_every: int, local_steps: Sequence[int] | None) -> float:
    """f_local: 1 with equal steps (None, or every n_r = H), else 1 - ADAPTIVE_GAIN x (1 - H / max_r n_r)."""
    if local_steps is None or not len(local_steps):
        return 1.0
    return 1.0 - ADAPTIVE_GAIN * (1.0 - sync_every / max(max(local_steps), sync_every))


def convergence(sync_every: int, replicas: int, *, codec: str = "none", delay: int = 0, mix: float = 0.0,
                landing: str = "mix", warmup: bool = True, local_steps: Sequence[int] | None = None,
                sync_moments: bool = False, async_staleness: float | None = None,
                target_steps: float | None = None) -> Convergence:
    """The module doc's factors for a recipe: a sync every `sync_every` steps of `replicas` replicas through `codec`,
    landing `delay` steps late by `landing` (mix `mix`), `local_steps` n_r per period (adaptive; None: equal),
    eager landing with or without its blocking `warmup` (geotrain.sync.streaming), moment sync, asynchronous
    updates of staleness factor `async_staleness` (None: synchronous), T0
    `target_steps` (None: unknown)."""
    if codec not in CODEC_FACTOR:
        raise ConvergenceError(f"convergence: outer codec must be one of {', '.join(CODEC_FACTOR)}, got {shown(codec)}")
    if sync_every < 1 or replicas < 1 or delay < 0 or delay >= max(sync_every, 1) and delay > 0:
        raise ConvergenceError(f"convergence: need H >= 1, R >= 1 and 0 <= tau < H, got H {sync_every}, "
                               f"R {replicas}, tau {delay}")
    if target_steps is not None and not target_steps > 0:
        raise ConvergenceError(f"convergence: steps to the target must be > 0, got {shown(target_steps)}")
    cold = landing == "eager" and delay > 0 and not warmup
    return Convergence(sync_factor(sync_every, replicas), CODEC_FACTOR[codec], adaptive_factor(sync_every, local_steps),
                       staleness_factor(sync_every, delay, mix, landing),
                       COLD_EAGER_FACTOR["equal" if local_steps is None else "adaptive"] if cold else 1.0,
                       MOMENT_SYNC_FACTOR if sync_moments else 1.0,
                       1.0 if async_staleness is None else float(async_staleness) ** ASYNC_STALENESS_WEIGHT,
                       float(delay) if landing == "eager" else 0.0, target_steps)


def crossing_step(steps: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """The step at which a loss curve first reaches `target`, interpolated linearly between the two evaluations
    around it (the first evaluation if it is already there; None if never): how the constants were fitted."""
    previous = None
    for step, loss in zip(steps, losses):
        if loss <= target:
            if previous is None:
                return float(step)
            (s0, l0) = previous
            return float(s0 + (step - s0) * (l0 - target) / (l0 - loss))
        previous = (step, loss)
    return None
