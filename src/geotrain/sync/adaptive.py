"""Adaptive local steps for DiLoCo: each replica takes H_r inner steps per outer period in proportion to its
measured speed, so that heterogeneous sites reach the outer sync together instead of waiting for the slowest.

    H_r = R x H x v_r / sum_q v_q        v_r = 1 / (replica r's mean inner-step seconds, last period)

rounded to integers >= 1 that sum to R x H (largest remainders; ties to the lower rank). H (`sync_every`) is
the *mean* of the H_r, not the fastest's: an outer period does R x H inner steps in all, as the equal schedule
does, so a run of N periods sees the same samples (the same token budget) with either schedule, and only who
computes them changes. The period then takes about R x H / sum_q v_q seconds, against H / min_q v_q.

Outer mean: the plain mean (1 / R) sum_r delta_r of the replicas' outer gradients delta_r (anchor - local
parameters), as with equal steps. Every inner step then counts 1 / R, on every replica (delta_r already sums
replica r's n_r steps), and a period's mean moves the anchor by the H steps' scale the outer optimizer is tuned
for, whatever the split: if every step moves the parameters by v, sum_r n_r v / R = H v. A mean weighted by
steps (n_r / N, N = sum n_r) would count each of replica r's steps n_r times over: its scale is
R sum n_r^2 / N^2 >= 1 times that (1.5 at 4 / 1 / 1 steps), and the fast replica's batches weigh n_r / n_q times
a slow one's. DiLoCo's outer Nesterov momentum (lr 0.7, momentum 0.9; up to 7x the pseudo-gradient)
amplified that into loss spikes (issue 50: hf:gpt2-tiny, 4 / 1 / 1 steps of H 2: one replica at 9.9-11 nats
from 3.3, then every replica after the next sync).

Agreement: at each outer sync the replicas all-gather two floats each (inner steps this period, mean step
seconds), before the outer exchange; every rank computes the weights and the next period's H_r from the same
gathered values, so every rank agrees on them. The first period runs H steps on every replica (nothing
measured yet), or shares them by a prior (`prior_step_s`; the runtime's: its GPUs' peak FLOP/s); from then on every sync re-balances from the period just ended, so a replica that slows down is
caught at the first sync after it (fully after the second, if it slowed mid-period). The sync trigger is "this
replica's H_r reached", not a global step count: `outer_step` (syncs completed) is what every rank agrees on,
and `while sync.outer_step < N` ends on every rank after N periods with the same parameters.

Step seconds: what the caller measures (`after_inner_step(seconds)`); the runtime passes each step's compute
seconds (ComputeTimer: under `--emulate-gpu-speed` the device's emulated compute), geotrain.diloco the time
between inner steps with the syncs left out (wall seconds, or the rank's emulated clock under `geotrain emulate`:
geotrain.emulate.emulated_clock), or an injected `step_time`. A non-positive or non-finite measurement on any rank
keeps the schedule as it is (nothing to divide by).

Overlap (`delay` tau, 0 <= tau < H; geotrain.sync.streaming's landings): the sync a replica starts when its
H_r is reached posts the exchange (async work) and the replica goes on with its next period at once; the
mean lands after d_r = min(H_r', max(1, round(tau x H_r' / H))) of the next period's H_r' steps, the same
share of every replica's period, so the replicas wait for it at about the same time. It lands as Streaming
DiLoCo's do: `landing="mix"` (local = mix x local + (1 - mix) x new anchor; mix 0 drops the d_r steps'
progress) or `landing="eager"` (this replica's own outer gradient applied at the start as the mean's proxy,
the correction when the mean lands: the d_r steps' progress is kept). `warmup` W: syncs of periods that end
before step W of the equal schedule block. `outer_step` counts the syncs started (periods completed); the
end (`flush`) lands the last one, and every replica ends on the anchor, the same parameters on every rank.

Checkpoints (`checkpoint_position`): the replicas are at different inner steps, so a checkpoint of the equal
schedule's step c (c in the period [c0, c0 + H)) is taken by replica r after floor(H_r x (c - c0) / H) of its
H_r steps: the same share of every replica's period, before its sync, so every replica gets there without
waiting for another. The sync in flight and the posted step times are settled (waited for and kept, applied when
due: geotrain.sync.settle); the state holds each replica's position in its period (steps and measured seconds so
far), its step count, the schedule (H_r), the gathered speeds of the last period, anchors, outer momentum and the
exchange's residuals. A resumed run then shares its periods as the uninterrupted one does and computes the same
numbers, except where a split differs: splits come from measured seconds, which differ from run to run (the
uninterrupted run's own repeat included) by measurement noise only. The split of the period in which the run
resumed is the saved one; a later period's differs only if the replicas' measured speed ratio falls on the other
side of a rounding boundary of R x H x v_r / sum v (largest remainders), and then by one step moved between two
replicas per period.

Regions (the runtime's `--dp-hierarchical`; `inner_exchange`): each region is one replica, as with equal steps:
its members average their gradients every step at full precision and take the same H_r (the region's agreed
speed: its slowest member's, geotrain.sync.factory), and the outer gradients travel through the hierarchical
exchange, whose mean over the group's ranks weighs each region by its member count (its share of the batch; with
regions of one size, the plain mean over regions above).

Moment sync (`sync_moments`, geotrain.sync.moments): each outer sync (with `moment_syncs` N, the first N) also
averages the inner AdamW's moments, in the same exchange as the outer gradients (`moment_parts`), and they land as
the outer gradients' mean does (blocking: the means; overlapped: mixed by `mix`, or eagerly). Each replica keeps its
own AdamW step count (its bias correction), which differs between replicas after uneven periods.

Supported: one fragment, blocking or overlapped, flat or by regions (geotrain.diloco's DiLoCo: flat only), with or
without moment sync; fragments are refused (`check_adaptive_settings`): their syncs fall at fixed step offsets,
which uneven H_r would break.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from geotrain.comm.gather import GatherLinks
from geotrain.cost.batch_shares import split_by_weights
from geotrain.optim.outer import OuterStep
from geotrain.optim.outer_state import state_device
from geotrain.optim.shards import local_shard
from geotrain.sync.base import (DPExchange, GradientSync, StepTimer, SyncError, SyncResult, free_grads, grad_carrier,
                                 set_grads)
from geotrain.sync.moments import (PARTS_WITH_MOMENTS, MomentSync, MomentTensors, check_moment_optimizer,
                                   check_moment_syncs)
from geotrain.sync.settle import Delivered, redeliver, settle
from geotrain.sync.streaming import ExchangeFactory, check_landing_settings

LOCAL_STEPS = ("equal", "adaptive")
"""How many inner steps each replica takes per outer period: H everywhere, or in proportion to its speed."""

Gather = Callable[[torch.Tensor], Callable[[], torch.Tensor]]
"""Posts the all-gather of this rank's (k,) float64 tensor over the DP group; the returned function waits for it
and gives the (world, k) tensor of every rank, in group-rank order."""


def adaptive_local_steps(step_seconds: Sequence[float], sync_every: int) -> list[int]:
    """H_r per replica (module doc): R x `sync_every` inner steps shared in proportion to 1 / `step_seconds`,
    integers >= 1 summing to R x sync_every. Any non-positive or non-finite time: [sync_every] x R."""
    seconds = np.asarray(step_seconds, dtype=np.float64)
    replicas = len(seconds)
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1 or replicas < 1:
        raise SyncError(f"adaptive local steps: sync_every must be an integer >= 1 and at least one replica, got "
                        f"{sync_every!r} and {replicas}")
    if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
        return [sync_every] * replicas
    return list(split_by_weights(1.0 / seconds, replicas * sync_every))  # the planner's rounding (largest remainder)


def check_adaptive_settings(local_steps: str, *, fragments: int = 1, hierarchical: bool = False,
                            who: str = "local_steps") -> None:
    """SyncError (one line) unless `local_steps` is one of LOCAL_STEPS and, when adaptive, the outer sync is the
    flat one of one fragment (module doc; a delay and moment sync are fine). `hierarchical`: refuse regions
    (geotrain.diloco's DiLoCo; the runtime runs them through `inner_exchange`, module doc)."""
    if local_steps not in LOCAL_STEPS:
        raise SyncError(f"{who} must be one of {', '.join(LOCAL_STEPS)}, got {local_steps!r}")
    if local_steps == "equal":
        return
    unsupported = [name for name, on in (("fragments > 1", fragments != 1), ("regions (hierarchical)", hierarchical))
                   if on]
    if unsupported:
        raise SyncError(f"{who} adaptive runs the flat outer sync of one fragment only; not with "
                        f"{', '.join(unsupported)} (their syncs fall at fixed step offsets, which per-replica step "
                        f"counts would break)")


def landing_steps(delay: int, following: int, sync_every: int) -> int:
    """d_r: after how many of its next period's `following` (H_r') inner steps a sync started with `delay` tau lands
    (module doc "Overlap": the same share tau / H of every replica's period, at least 1, at most H_r')."""
    return min(following, max(1, round(delay * following / sync_every)))


@dataclass
class InFlight:
    """A sync this replica started and has not landed: after `lands_after` steps of the period that follows
    (geotrain.sync.elastic_adaptive's too: there the exchange ran whole, `delivered` from the start)."""

    land: Callable[[StepTimer], int]
    proxy: list[torch.Tensor] | None  # eager landing: the change applied at the start
    started: int  # this replica's 0-based inner step it started after
    lands_after: int = 1
    moments: bool = False  # the inner optimizer's moments travel in this sync
    delivered: Delivered | None = None  # settled (sync/settle.py): at a checkpoint, or an elastic exchange's

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of it (settled first: SyncError otherwise)."""
        if self.delivered is None:
            raise SyncError("a sync in flight cannot be saved before it is settled: settle() first")
        return {"started": self.started, "lands_after": self.lands_after, "delivered": self.delivered.state_dict(),
                "moments": self.moments, **({} if self.proxy is None else {"proxy": [t.clone() for t in self.proxy]})}

    @classmethod
    def of(cls, saved: dict[str, Any], groups: Callable[[bool], list[list[torch.nn.Parameter]]]) -> InFlight:
        """The flight `state_dict` saved, landing into `groups(moments)` (the shadows the exchange writes)."""
        delivered = Delivered.of(saved["delivered"])
        moments = bool(saved.get("moments", False))
        return cls(redeliver(delivered, groups(moments)), saved.get("proxy"), int(saved["started"]),
                   int(saved["lands_after"]), moments, delivered)


def land_flight(flight: InFlight, outer: OuterStep, shadows: Sequence[torch.nn.Parameter],
                moments: MomentSync | None, mix: float, timer: StepTimer) -> int:
    """Land `flight` (module doc "Overlap": the mix or eager rule, the moments with it): the anchor steps with the
    mean, the local parameters (and moments) move to it; the shadows freed. Bytes handed when it was posted."""
    dp_bytes = flight.land(timer)
    with timer:
        outer.land([s.grad for s in shadows], flight.proxy, mix)  # type: ignore[misc]
        free_grads(shadows)
        land_moments(moments if flight.moments else None, mix, eager=flight.proxy is not None)
    return dp_bytes


def land_moments(moments: MomentSync | None, mix: float, eager: bool) -> None:
    """The moments' means that travelled with a sync land (module doc "Moment sync"), their shadows freed; None:
    none travelled."""
    if moments is None:
        return
    if eager:
        moments.land_eager()
    else:
        moments.land(mix)
    free_grads([*moments.first, *moments.second])


class AdaptiveOuterSync(GradientSync):
    """DiLoCo whose replicas each take H_r inner steps per outer period and average their outer gradients, every
    inner step counting alike (module doc). `make_exchange`: builds the DP exchange of (name, fp32
    shadow) pairs, the tensors the outer gradients travel in (the model's gradients are left alone);
    `gather`: the posted all-gather of a float over the DP group (Gather); `rank`: this replica's index in the
    group of `replicas`; `adaptive` False keeps H_r = H;
    `step_time`: replaces the measured step seconds (tests, or a caller that knows its speed); `prior_step_s`:
    relative seconds per step of each replica known before anything is measured (the runtime's: 1 / its GPU's
    peak FLOP/s), which sets the first period's H_r (None: H on every replica); `delay`, `landing`, `mix`,
    `warmup`: the overlap (module doc; 0: every sync blocks); `periods`: the run's outer periods where the caller
    stops every rank at that sync (the runtime's loop; None: not known): the last sync then posts no step times
    (no period follows to share out) and `flush` gathers no step counts (no replica stepped since), which spares
    the run's end two latency-bound collectives; `outer_state`: where the anchor, outer momentum and shadows live,
    "device" or "host" (geotrain.optim.outer_state); `sync_moments`, `moment_syncs`: moment sync (module doc;
    `make_exchange` then takes the moments' shadows as its second argument, geotrain.sync.streaming's
    ExchangeFactory)."""

    def __init__(self, named_params: Sequence[tuple[str, torch.nn.Parameter]], optimizer: torch.optim.Optimizer,
                 make_exchange: ExchangeFactory, sync_every: int,
                 outer_lr: float, outer_momentum: float, gather: Gather, rank: int, replicas: int,
                 adaptive: bool = True, step_time: Callable[[], float] | None = None,
                 prior_step_s: Sequence[float] | None = None, delay: int = 0, landing: str = "mix",
                 mix: float = 0.0, warmup: int = 0, periods: int | None = None, outer_state: str = "device",
                 inner_exchange: DPExchange | None = None, sync_moments: bool = False,
                 moment_syncs: int | None = None) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < replicas:
            raise SyncError(f"AdaptiveOuterSync: rank must be an integer in 0..{replicas - 1}, got {rank!r}")
        check_landing_settings(sync_every, delay, mix, landing, warmup)
        if sync_moments:
            check_moment_optimizer(optimizer, "AdaptiveOuterSync")
        check_moment_syncs(moment_syncs, sync_moments)
        if periods is not None and (isinstance(periods, bool) or not isinstance(periods, int) or periods < 1):
            raise SyncError(f"AdaptiveOuterSync: periods must be an integer >= 1 or None, got {periods!r}")
        self.periods = periods
        self.delay, self.landing, self.mix, self.warmup = delay, landing, float(mix), warmup
        self._flight: InFlight | None = None
        named_params = list(named_params)
        self.params = [p for _, p in named_params]
        self.optimizer = optimizer
        self.outer = OuterStep(self.params, sync_every, outer_lr, outer_momentum, outer_state)
        self.shadows = [grad_carrier(local_shard(p).shape, state_device(p, outer_state)) for p in self.params]
        self.moments = MomentSync(optimizer, named_params, None, outer_state) if sync_moments else None
        self.moment_syncs = moment_syncs
        named_shadows = [(name, s) for (name, _), s in zip(named_params, self.shadows, strict=True)]
        self.exchange = (make_exchange(named_shadows) if self.moments is None
                         else make_exchange(named_shadows, self._moment_tensors()))
        self.inner_exchange = inner_exchange
        self.gather = gather
        self.rank, self.replicas, self.adaptive = rank, replicas, adaptive
        self.step_time = step_time
        self.sync_every = sync_every
        if prior_step_s is not None and len(prior_step_s) != replicas:
            raise SyncError(f"AdaptiveOuterSync: prior_step_s needs one value per replica ({replicas}), got "
                            f"{list(prior_step_s)!r}")
        self.local_steps = (adaptive_local_steps(prior_step_s, sync_every) if adaptive and prior_step_s is not None
                            else [sync_every] * replicas)
        """H_r of the current period, per replica (group-rank order); the same list on every rank."""
        self.outer_step = 0
        """Outer syncs completed (the same on every rank between syncs)."""
        self.inner_steps = 0
        """This replica's inner steps so far."""
        self.period_steps = 0
        self._period_seconds = 0.0
        self._posted: Callable[[], torch.Tensor] | None = None
        self.history: list[dict[str, Any]] = []
        """Per sync: the steps each replica took (and their shares of the period's), their mean step seconds, and
        H_r next."""

    def _moment_tensors(self) -> MomentTensors:
        assert self.moments is not None
        return self.moments.named_first(), self.moments.named_second()

    def moments_travel(self) -> bool:
        """True if the sync started now (after `outer_step` syncs) carries the moments (module doc)."""
        return self.moments is not None and (self.moment_syncs is None or self.outer_step < self.moment_syncs)

    def _groups(self, moments: bool) -> list[list[torch.nn.Parameter]]:
        """The shadow parameters whose gradients the exchange writes (the moments' too when they travel)."""
        extra = [] if not moments or self.moments is None else [self.moments.first, self.moments.second]
        return [self.shadows, *extra]

    @property
    def my_local_steps(self) -> int:
        """This replica's H_r for the current period."""
        return self.local_steps[self.rank]

    def progress_step(self) -> int:
        """Where this replica is on the equal schedule's step axis (outer_step x H + its share of the period
        done, in steps of H): what a learning-rate schedule of a run of N x H steps reads."""
        return self.outer_step * self.sync_every + (self.period_steps * self.sync_every) // self.my_local_steps

    def step(self, step: int, timer: StepTimer) -> SyncResult:
        """The runtime's call after backward: the inner step, then the outer sync if this replica's H_r is reached.
        The step's seconds are `timer.seconds` (the runtime zeroes it at each step's start)."""
        inner_bytes = 0 if self.inner_exchange is None else self.inner_exchange.exchange(step, timer)
        with timer:
            self.optimizer.step()
        return SyncResult(inner_bytes + self.after_inner_step(timer.seconds, timer), None)

    def after_inner_step(self, seconds: float, timer: StepTimer) -> int:
        """Count one inner step that took `seconds` (the injected `step_time` if given); sync when this
        replica's H_r is reached. Returns the bytes handed to the outer exchange."""
        self.inner_steps += 1
        self.period_steps += 1
        self._period_seconds += float(self.step_time() if self.step_time is not None else seconds)
        dp_bytes = 0
        if self._flight is not None and self.period_steps >= self._flight.lands_after:
            dp_bytes += self._land(timer)
        if self.period_steps < self.my_local_steps:
            return dp_bytes
        return dp_bytes + self._sync(timer, [float(h) for h in self.local_steps])

    @property
    def in_flight(self) -> int:
        """Syncs started and not yet landed (0 or 1)."""
        return int(self._flight is not None)

    def flush(self, timer: StepTimer) -> int:
        """Land the sync in flight, then sync the steps taken since the last sync, on every rank at once (each
        rank calls it, in the same period), blocking: the step counts are gathered first (a partial period's are
        not the H_r); no exchange when no replica stepped since. Every replica then holds the anchor. Lands
        the posted gather of step times; the schedule is left as it is."""
        dp_bytes = 0 if self._flight is None else self._land(timer)
        self._land_times()
        ended = self.periods is not None and self.outer_step >= self.periods  # no replica stepped since: no gather
        if ended and self.period_steps:
            raise SyncError(f"AdaptiveOuterSync: {self.period_steps} inner steps after the run's last outer "
                            f"period ({self.periods}): a caller that gives periods stops every rank there")
        mine = torch.tensor([float(self.period_steps)], dtype=torch.float64)
        steps = [] if ended else self.gather(mine)().reshape(-1).tolist()
        if sum(steps):
            return dp_bytes + self._sync(timer, steps, rebalance=False, blocking=True)
        with timer:
            self.outer.reset_params()  # an eager landing leaves the anchor to within rounding: exactly it
        return dp_bytes

    def _land(self, timer: StepTimer) -> int:
        """Wait for the sync in flight and apply the mean (module doc: mix or eager landing)."""
        assert self._flight is not None
        flight, self._flight = self._flight, None
        dp_bytes = land_flight(flight, self.outer, self.shadows, self.moments, self.mix, timer)
        self._sync_landed(self.inner_steps - 1, dp_bytes, started=flight.started)
        return dp_bytes

    def _land_times(self) -> list[float] | None:
        """Wait for the step times posted at the previous sync; None if none is in flight."""
        if self._posted is None:
            return None
        seconds = self._posted().reshape(-1).tolist()
        self._posted = None
        return seconds

    def _sync(self, timer: StepTimer, steps: list[float], rebalance: bool = True, blocking: bool = False) -> int:
        """The outer sync of a period in which replica r took steps[r] inner steps (module doc): blocking, or
        started here and landed in the next period."""
        total = sum(steps)
        self._sync_started(self.inner_steps - 1)
        blocking = blocking or self.delay == 0 or (self.outer_step + 1) * self.sync_every <= self.warmup
        moments = self.moments_travel()
        parts = {} if self.moments is None else {"parts": PARTS_WITH_MOMENTS if moments else 1}
        with timer:
            local = self.outer.outer_gradients()
            set_grads(self.shadows, local)  # the plain mean (module doc): no weight by steps
            if moments:
                self.moments.load(keep_sent=not blocking and self.landing == "eager")  # type: ignore[union-attr]
        dp_bytes = 0
        if blocking:
            dp_bytes = self.exchange.exchange(self.outer_step, timer, **parts)
            with timer:
                self.outer.apply([s.grad for s in self.shadows])  # type: ignore[misc]
                free_grads(self.shadows)
                land_moments(self.moments if moments else None, 0.0, eager=False)
            self._sync_landed(self.inner_steps - 1, dp_bytes)
        else:
            land = self.exchange.start(self.outer_step, timer, **parts)  # type: ignore[attr-defined]
            proxy = None
            if self.landing == "eager":
                with timer:
                    proxy = self.outer.start_eager(local)
            self._flight = InFlight(land, proxy, self.inner_steps - 1, moments=moments)
        measured = self._land_times()
        if rebalance and self.adaptive and measured is not None:
            self.local_steps = adaptive_local_steps(measured, self.sync_every)
        if self._flight is not None:
            following = self.my_local_steps
            self._flight.lands_after = landing_steps(self.delay, following, self.sync_every)
        if rebalance and (self.periods is None or self.outer_step + 1 < self.periods):
            # this period's mean step seconds travel while the next period computes
            self._posted = self.gather(torch.tensor([self._period_seconds / self.period_steps], dtype=torch.float64))
        self.history.append({"steps": [int(s) for s in steps], "step_shares": [s / total for s in steps],
                             "step_s": measured, "next_local_steps": list(self.local_steps)})
        self.outer_step += 1
        self.period_steps, self._period_seconds = 0, 0.0
        return dp_bytes

    def fingerprint(self) -> float:
        """The anchor's float64 sum (every replica's is the same after each sync)."""
        return self.outer.anchor_sum()

    def checkpoint_position(self, progress: int) -> int | None:
        """The inner steps of the current period after which this replica takes the checkpoint of the equal
        schedule's step `progress` (module doc), or None when that step is not in the current period."""
        start = self.outer_step * self.sync_every
        if not start <= progress < start + self.sync_every:
            return None
        return self.my_local_steps * (progress - start) // self.sync_every

    def settle(self, timer: StepTimer) -> None:
        """Wait for the sync in flight and the posted step times, and keep them (module doc: checkpoints)."""
        if self._flight is not None and self._flight.delivered is None:
            groups = self._groups(self._flight.moments)
            self._flight.delivered = settle(self._flight.land, timer, groups)
            self._flight.land = redeliver(self._flight.delivered, groups)
        if self._posted is not None:
            times = self._posted().clone()
            self._posted = lambda: times

    def state_dict(self) -> dict[str, Any]:
        """Inner and outer state, the exchange's residuals, the schedule, this replica's position in its period and
        what is in flight (settled: `settle` first)."""
        in_flight = None if self._flight is None else self._flight.state_dict()
        return {"optimizer": self.optimizer.state_dict(), "exchange": self.exchange.state_dict(),
                "outer": self.outer.state_dict(), "local_steps": list(self.local_steps),
                "outer_step": self.outer_step, "inner_steps": self.inner_steps, "period_steps": self.period_steps,
                "period_seconds": self._period_seconds, "history": list(self.history),
                **({} if self.moments is None else {"moments": self.moments.state_dict()}),
                **({} if in_flight is None else {"in_flight": in_flight}),
                **({} if self._posted is None else {"posted_step_s": self._posted().clone()})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "local_steps" not in state or len(state["local_steps"]) != self.replicas:
            raise ValueError(f"checkpoint holds no adaptive outer sync of {self.replicas} replicas")
        self.optimizer.load_state_dict(state["optimizer"])
        self.outer.load_state_dict(state["outer"])
        self.exchange.load_state_dict(state["exchange"])
        self.local_steps = [int(h) for h in state["local_steps"]]
        self.outer_step, self.inner_steps = int(state["outer_step"]), int(state["inner_steps"])
        self.period_steps, self._period_seconds = int(state["period_steps"]), float(state["period_seconds"])
        self.history = list(state["history"])
        if (self.moments is None) != ("moments" not in state):
            raise ValueError("checkpoint and run disagree on sync_moments (on in one, off in the other)")
        if self.moments is not None:
            self.moments.load_state_dict(state["moments"])
        self._flight = None if "in_flight" not in state else InFlight.of(state["in_flight"], self._groups)
        times = state.get("posted_step_s")
        self._posted = None if times is None else (lambda: times)


def gather_floats(group: Any, run: Callable[[Callable[[], Any]], Any], links: GatherLinks | None = None) -> Gather:
    """A Gather over process group `group` (None: the default one): posts the all-gather (async work,
    geotrain.comm.TorchCollective.start_all_gather) and returns the function that waits for it through `run(wait)`
    (a transport that times and counts it as a posted collective, or directly: `lambda wait: wait()`). `links`:
    the members' links, whose rule (geotrain.comm.gather) picks the algorithm: on latency-bound links one
    all-to-all round ("direct") instead of the ring's R - 1 (the few bytes of step times would otherwise take
    three WAN latencies on four sites and could hold up the next sync); None: the ring."""
    from geotrain.comm import TorchCollective

    collective = TorchCollective(group)

    def gather(mine: torch.Tensor) -> Callable[[], torch.Tensor]:
        mine = mine.reshape(-1)
        algorithm = "ring" if links is None else links.algorithm(mine.numel() * mine.element_size())
        started = collective.start_all_gather([mine], algorithm)

        def wait() -> torch.Tensor:
            run(started.wait)
            return started.wait().reshape(collective.world_size, -1)

        return wait

    return gather
