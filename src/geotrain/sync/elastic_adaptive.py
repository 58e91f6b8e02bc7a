"""Adaptive local steps on an elastic run's torchft quorum (`train --elastic --sync-every H --local-steps adaptive`):
each live replica group takes H_g inner steps per outer period, in proportion to its measured speed
(geotrain.sync.adaptive's rule: its `adaptive_local_steps` when every group is present), and the groups meet at an
outer-sync index. A lost group's steps are taken by the others: no sample of the run's budget is lost to a failure
but the steps of the period in which the group died.

Where the quorum meets: at the end of each group's period (its H_g inner steps done), before the outer exchange.
torchft's Manager counts committed exchanges, one per outer sync (plus the start-up quorum's), so its step is the
outer-sync index: every group reaches the quorum of sync p after its own H_g steps of period p, whatever H_g is,
and a group whose Manager step is behind the quorum's (a restarted one) is behind by whole periods.

Recovery (torchft's live recovery at an outer sync): a peer hands its state when the quorum is computed, at its
sync point (its period's steps done, its exchange not started): the model (its local parameters), the inner AdamW,
the outer state (anchor, outer momentum), the outer-sync index and the adaptive state the groups share: every
group's last measured step seconds and the current split. A group's own position (its steps into the period) is
not copied: the recovering group is at that sync point too (`at_sync`), joins this very exchange with weight 0 (its
outer gradient would repeat the peer's: geotrain.sync.elastic), and every member applies the same mean to the
same anchor, so all hold the same parameters after it.

The split (`quorum_split`): each exchange also sums, over the quorum that commits it (ManagerExchange's side sum),
every member's presence and its mean step seconds of the period just ended (0: none, a group that took no step:
one that recovered in this quorum). Every member then holds the same table of last measured seconds per group (a
group absent from the quorum keeps its last entry) and shares the next period's inner steps among the n
groups present, by that table: the whole period's R x H steps (R: the plan's groups), a lost group's share
included. A lost group thus leaves the split at the first sync without it (the survivors' shares recomputed from
their own measured speeds, the survivors taking its steps); a restarted group rejoins at a sync and is re-balanced
there.

What speed a restarted group starts with: the last one measured for its group (the same site and GPU) before it
was lost, which the survivors kept in the shared table and hand over with the state; a group never measured (lost
in the first period) gets the prior (`prior_step_s`: 1 / its GPU's peak FLOP/s, relative) scaled by the measured
groups' mean measured / prior ratio; with no prior, the equal split. The first period is shared by the priors.

Data (`position`): the R x H inner steps of period p train the slices of the equal schedule's steps pH .. pH + H - 1
(slice s of step t: group s's part of step t's global batch), numbered i = s x H + (t - pH); the groups present, in
group order, take consecutive runs of H_g of them: each slice once, the equal schedule's samples, with every group
present or not (a group's own H slices when the split is equal and all are present). Only a group lost mid-period
loses samples: its slices of that period.

The outer mean: sum_g delta_g / R over the groups that took steps in the period (absent and recovering ones add 0),
every inner step counting 1 / R as in a period with every group (geotrain.sync.adaptive's "Outer mean"), so a period
whose R x H steps a quorum of n < R groups took moves the anchor by the same H steps' scale. The exchange averages
over its c contributors (geotrain.sync.elastic); its mean is scaled by c / R.

Delay (`delay` tau > 0, --sync-delay; geotrain.sync.adaptive's "Overlap"): the rule for a quorum that changes is
elastic streaming's (geotrain.sync.elastic): no sync is ever in flight across a quorum. Sync p's exchange runs whole
and is committed (retried on new quorums as any) in sync p's quorum; what it delivered is kept (`flight`,
geotrain.sync.settle) and lands after d_g = min(H_g', max(1, round(tau x H_g' / H))) of the group's next H_g'
steps (the same share of every group's period) by the mix or eager rule, as a non-elastic adaptive run lands it:
the same numbers, only the overlap of the exchange with those d_g steps is not there. Every member that committed
lands the same mean; a member lost after the commit changes nothing for the others (they land what their quorum
committed; it restarts and recovers at a later sync). Nothing is in flight at a sync point (d_g <= H_g', and a
group that took no step since lands it before its sync), so a recovering group copies a peer's state with no
exchange in flight and takes part in that sync as any member (weight 0). Syncs of periods that end at or before
step `warmup` block; the run's end (`flush`) lands the last sync's mean, every group then holds the anchor.

Moments (`moment_parts`, --sync-moments; geotrain.sync.moments): each sync (the first `moment_syncs`) also averages
the inner AdamW's moments over the same quorum's contributors, in the outer gradients' try and committed with them
(the first moment as a delta from its anchor through the outer codec, the second through log-block: elastic
streaming's parts), and they land with the parameters (blocking: the means; delayed: mixed by `mix`, or eagerly). A
recovering group takes its peer's AdamW state and moment anchor and lands the same means; each group keeps its own
AdamW step count (bias correction).

Checkpoints and resume: checkpoints are written after the syncs that are due (one copy by the quorum's rank 0, as
every elastic run: runtime/elastic/checkpoint.py) and hold the shared state above (outer-sync index, measured step
seconds, split) with the writer's inner AdamW, moment anchor and the sync in flight (saved, not finished: its
delivered mean, which lands d_g steps into the resumed period as in the uninterrupted run). `--resume` starts every
group at that sync with that table and split, so the resumed run's first period is the uninterrupted one's (the
writer's inner steps bit for bit; the other groups' first steps from the same parameters, then their own moments
replaced by the writer's, as a recovering group's are; with a delay, their first d_g steps from the writer's local
parameters, up to the landing); later splits come from new measurements. A non-elastic adaptive run's checkpoint at
an outer sync resumes too (`from_adaptive_state`, its sync in flight and moments included).

Sharded groups (K > 1 devices per slot, FSDP2 inside a group): the parameters are DTensors; the outer state and the
shadows the outer gradients travel in are this process's shards (geotrain.optim.shards), and position (s, k)'s
exchange goes to the same position of every group over its own Manager. Every position sends the group's agreed
step seconds (`agree`: their max, the slowest shard's), so all positions compute the same split, and take the same
H_g in lockstep (FSDP2's collectives need every shard at each step).

    sync = ElasticAdaptiveSync(params, adamw, OuterStep(...), exchange, group=g, replicas=R, sync_every=H,
                               periods=ceil(steps / H), prior_step_s=...)
    while sync.outer_step < sync.periods:
        if sync.due: quorum(); sync.outer_sync(timer)       # at the outer-sync index
        else: t, s = sync.position(); train slice s of step t; sync.step(t, timer)
    sync.flush(timer)                                       # the last sync's mean lands (a delay)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.optim.outer import OuterStep
from geotrain.optim.shards import local_shard
from geotrain.cost.batch_shares import split_by_weights
from geotrain.sync.adaptive import InFlight, land_flight, land_moments, landing_steps
from geotrain.sync.base import GradientSync, StepTimer, SyncError, SyncResult, free_grads, grad_carrier, set_grads
from geotrain.sync.exchange import ExtraTensors
from geotrain.sync.moments import PARTS_WITH_MOMENTS, MomentSync, MomentTensors, check_moment_syncs
from geotrain.sync.settle import redeliver, settle
from geotrain.sync.streaming import check_landing_settings


def estimated_step_s(measured: Sequence[float], prior_s: Sequence[float] | None) -> list[float]:
    """Seconds per inner step of each group: its last measured (finite, > 0), else its prior scaled by the
    measured groups' mean measured / prior ratio (none measured: the prior as it is); NaN without a prior."""
    known = [(m, p) for m, p in zip(measured, prior_s or [math.nan] * len(measured), strict=True)
             if math.isfinite(m) and m > 0 and math.isfinite(p) and p > 0]
    ratio = sum(m / p for m, p in known) / len(known) if known else 1.0  # none measured: the priors alike
    return [m if math.isfinite(m) and m > 0 else (math.nan if prior_s is None else prior_s[g] * ratio)
            for g, m in enumerate(measured)]


def quorum_split(step_s: Sequence[float], present: Sequence[int], sync_every: int) -> list[int]:
    """H_g per group (R ints, 0 for a group not `present`): the period's R x `sync_every` inner steps (R =
    len(`step_s`): every group's, a lost one's included) shared among the n present groups in proportion to
    1 / their `step_s` (equally if any is unknown), integers >= 1 (module doc "Data")."""
    if not present:
        raise SyncError("elastic adaptive local steps: a quorum of no replica group")
    seconds = [step_s[g] for g in present]
    known = all(math.isfinite(s) and s > 0 for s in seconds)
    shares = split_by_weights([1.0 / s if known else 1.0 for s in seconds], len(step_s) * sync_every)
    split = [0] * len(step_s)
    for g, h in zip(present, shares, strict=True):
        split[g] = h
    return split


def period_position(period: int, index: int, sync_every: int) -> tuple[int, int]:
    """(equal-schedule step t, slice s) of inner step number `index` of period `period` (module doc "Data")."""
    return period * sync_every + index % sync_every, index // sync_every


def from_adaptive_state(state: dict[str, Any]) -> dict[str, Any]:
    """A non-elastic adaptive run's sync state (geotrain.sync.adaptive.AdaptiveOuterSync, one replica's) as this
    sync's: its outer-sync index, split (`local_steps`, this period's), last measured step seconds per replica
    (`posted_step_s`: the period before, which its next sync shares by; none posted: not measured), its moment-sync
    anchor and its sync in flight (settled; they land as this sync's). ValueError (one line) for one taken mid-period
    (a --checkpoint-every that is not a multiple of H): elastic adaptive runs resume at outer syncs."""
    if int(state["period_steps"]) != 0:
        raise ValueError(f"an adaptive checkpoint taken {state['period_steps']} steps into a period: elastic adaptive "
                         f"runs resume at outer syncs (resume a checkpoint of a step that ends an outer period)")
    posted = state.get("posted_step_s")
    replicas = len(state["local_steps"])
    step_s = [math.nan] * replicas if posted is None else [float(s) for s in posted.reshape(-1).tolist()]
    return {"optimizer": state["optimizer"], "exchange": {}, "outer": state["outer"],
            "outer_step": int(state["outer_step"]), "group_step_s": step_s,
            "group_local_steps": [int(h) for h in state["local_steps"]], "at_sync": False,
            "history": list(state["history"]), **{key: state[key] for key in ("moments", "in_flight") if key in state}}


class ElasticAdaptiveSync(GradientSync):
    """DiLoCo with adaptive local steps over a torchft quorum (module doc). `exchange`: a ManagerExchange of
    `params` (its side sums carry presence and step seconds); `group`: this replica group (0..`replicas` - 1);
    `periods`: the run's outer periods; `prior_step_s`: relative seconds per step of each group before any is
    measured (None: the first period equal); `agree`: the group's one value of a float over its processes (a group of
    S x K > 1 processes: their max, so that every position sends the same seconds and computes the same split;
    None: this process's own). `delay`, `landing`, `mix`, `warmup`: the sync delay (module doc "Delay"; 0: every
    sync lands at once); `moment_parts`: the exchange parts the inner AdamW's moments travel in (module doc
    "Moments", geotrain.sync.moments.moment_parts with the outer codec; None: the outer gradients only), in the first
    `moment_syncs` syncs (None: every one)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer, outer: OuterStep,
                 exchange: Any, group: int, replicas: int, sync_every: int, periods: int,
                 prior_step_s: Sequence[float] | None = None, agree: Callable[[float], float] | None = None,
                 delay: int = 0, landing: str = "mix", mix: float = 0.0, warmup: int = 0,
                 moment_parts: Callable[[MomentTensors], Sequence[ExtraTensors]] | None = None,
                 moment_syncs: int | None = None) -> None:
        if not 0 <= group < replicas:
            raise SyncError(f"ElasticAdaptiveSync: group must be in 0..{replicas - 1}, got {group!r}")
        if prior_step_s is not None and len(prior_step_s) != replicas:
            raise SyncError(f"ElasticAdaptiveSync: prior_step_s needs one value per group ({replicas}), got "
                            f"{list(prior_step_s)!r}")
        check_landing_settings(sync_every, delay, mix, landing, warmup)
        check_moment_syncs(moment_syncs, moment_parts is not None)
        self.params, self.optimizer, self.outer, self.exchange = list(params), optimizer, outer, exchange
        # the outer gradients travel in shard-sized shadows (a sharded plan's DTensors: this process's shards only,
        # geotrain.optim.shards), through the exchange's quorum with the side sums
        self.shadows = [grad_carrier(local_shard(p).shape, local_shard(p).device) for p in self.params]
        self.moments = None if moment_parts is None else MomentSync(optimizer, [(str(i), p) for i, p in
                                                                               enumerate(self.params)])
        self.moment_syncs = moment_syncs
        self.travel = exchange.over(self.shadows) if self.moments is None else exchange.over(
            self.shadows, moment_parts((self.moments.named_first(), self.moments.named_second())))
        self.delay, self.landing, self.mix, self.warmup = delay, landing, float(mix), warmup
        self.flight: InFlight | None = None
        """The last sync's mean, delivered and not yet landed (module doc "Delay")."""
        self.group, self.replicas, self.sync_every, self.periods = group, replicas, sync_every, periods
        self.prior_s = None if prior_step_s is None else [float(s) for s in prior_step_s]
        self.agree = agree
        self.step_s = [math.nan] * replicas
        """Last measured mean seconds per inner step of each group (NaN: never measured); shared state."""
        self.local_steps = quorum_split(estimated_step_s(self.step_s, self.prior_s), list(range(replicas)),
                                        sync_every)
        """H_g of the current period per group (0: not in the last quorum); shared state."""
        self.outer_step = 0
        """Outer syncs committed (the Manager's step less the start-up quorum's)."""
        self.period_steps, self.period_seconds, self.inner_steps = 0, 0.0, 0
        self.at_sync = False
        """True after loading a peer's state: this group is at that peer's sync point (no steps of its own)."""
        self.history: list[dict[str, Any]] = []

    @property
    def my_local_steps(self) -> int:
        return self.local_steps[self.group]

    @property
    def due(self) -> bool:
        """Whether this group is at its sync point (its H_g steps done, or a peer's state just loaded)."""
        return self.at_sync or self.period_steps >= self.my_local_steps

    def position(self) -> tuple[int, int]:
        """(equal-schedule step, slice) of this group's next inner step (module doc "Data")."""
        offset = sum(self.local_steps[:self.group])
        return period_position(self.outer_step, offset + self.period_steps, self.sync_every)

    def progress_step(self) -> int:
        """This group's place on the equal schedule's step axis (what the learning-rate schedule reads)."""
        done = (self.period_steps * self.sync_every) // max(1, self.my_local_steps)
        return self.outer_step * self.sync_every + min(done, self.sync_every - 1)

    def step(self, step: int, timer: StepTimer) -> SyncResult:
        """The inner step after backward (no exchange: `outer_sync` is called at the quorum), then the last sync's
        landing when it is due; the step's compute seconds are `timer.seconds` (the caller zeroes it at each step's
        start)."""
        with timer:
            self.optimizer.step()
        self.period_steps += 1
        self.inner_steps += 1
        self.period_seconds += float(timer.seconds)
        if self.flight is not None and self.period_steps >= self.flight.lands_after:
            self._land(timer)
        return SyncResult(0, None)

    def moments_travel(self) -> bool:
        """True if the sync of the current period carries the inner AdamW's moments (module doc "Moments")."""
        return self.moments is not None and (self.moment_syncs is None or self.outer_step < self.moment_syncs)

    def _groups(self, moments: bool) -> list[list[torch.nn.Parameter]]:
        """The shadows whose gradients the exchange writes (the moments' too when they travel)."""
        return [self.shadows, *([] if not moments or self.moments is None else [self.moments.first,
                                                                                 self.moments.second])]

    def _land(self, timer: StepTimer) -> None:
        """Apply the last sync's kept mean (module doc "Delay": the mix or eager rule, the moments with it)."""
        assert self.flight is not None
        flight, self.flight = self.flight, None
        nbytes = land_flight(flight, self.outer, self.shadows, self.moments, self.mix, timer)
        self._sync_landed(self.inner_steps - 1, nbytes, started=flight.started)

    def flush(self, timer: StepTimer) -> None:
        """The run's end (or a launch's, --stop-after): land the sync in flight; every group then holds the anchor
        exactly (an eager landing leaves it to within rounding), the same parameters in every group."""
        if self.flight is not None:
            self._land(timer)
        with timer:
            self.outer.reset_params()

    def outer_sync(self, timer: StepTimer) -> int:
        """The outer sync of the current period over the quorum just started (module doc): the outer gradients'
        mean (and the moments', module doc "Moments") and this period's step seconds, committed; the outer step
        now, or kept to land after d steps of the next period (module doc "Delay"); then the next period's split.
        Bytes handed to the exchange. StepSuperseded (geotrain.sync.elastic) if a retry's quorum handed this group
        a peer's state."""
        if self.flight is not None:  # a period shorter than d (a group that took no step since): land it first
            self._land(timer)
        self._sync_started(self.inner_steps - 1)
        blocking = self.delay == 0 or (self.outer_step + 1) * self.sync_every <= self.warmup
        moments = self.moments_travel()
        with timer:
            local = self.outer.outer_gradients()
            set_grads(self.shadows, local)
            if moments:
                self.moments.load(keep_sent=not blocking and self.landing == "eager")  # type: ignore[union-attr]
            side = torch.zeros(2 * self.replicas, dtype=torch.float64)
            side[self.group] = 1.0
            if self.period_steps:  # the group's processes step together: all with steps, or all without
                seconds = self.period_seconds / self.period_steps
                side[self.replicas + self.group] = seconds if self.agree is None else self.agree(seconds)
        parts = {} if self.moments is None else {"parts": PARTS_WITH_MOMENTS if moments else 1}
        dp_bytes = self.travel.exchange(self.outer_step, timer, side=side, **parts)
        summed = self.exchange.side_sum.tolist()
        present = [g for g in range(self.replicas) if summed[g] > 0]
        measured = summed[self.replicas:]
        steps_taken = {g: self.local_steps[g] for g in present if measured[g] > 0}
        if 0 < len(steps_taken) < self.replicas:  # module doc "The outer mean": sum / R, not the contributors' mean
            with timer, torch.no_grad():
                for shadow in self.shadows:
                    shadow.grad.mul_(len(steps_taken) / self.replicas)
        if blocking:
            with timer:
                self.outer.apply([s.grad for s in self.shadows])
                free_grads(self.shadows)
                land_moments(self.moments if moments else None, 0.0, eager=False)
            self._sync_landed(self.inner_steps - 1, dp_bytes)
        else:  # committed in this quorum: nothing is in flight across quorums, the kept mean lands d steps later
            groups = self._groups(moments)
            delivered = settle(lambda _: dp_bytes, timer, groups)
            with timer:
                proxy = self.outer.start_eager(local) if self.landing == "eager" else None
            self.flight = InFlight(redeliver(delivered, groups), proxy, self.inner_steps - 1, moments=moments,
                                   delivered=delivered)
        self.step_s = [m if m > 0 else old for m, old in zip(measured, self.step_s, strict=True)]
        self.local_steps = quorum_split(estimated_step_s(self.step_s, self.prior_s), present, self.sync_every)
        if self.flight is not None:
            self.flight.lands_after = landing_steps(self.delay, self.my_local_steps, self.sync_every)
        self.history.append({"present": present, "steps": steps_taken, "step_s": list(self.step_s),
                             "next_local_steps": list(self.local_steps), "moments": moments,
                             "lands_after": None if self.flight is None else self.flight.lands_after})
        self.outer_step += 1
        self.period_steps, self.period_seconds, self.at_sync = 0, 0.0, False
        return dp_bytes

    def fingerprint(self) -> float:
        return self.outer.anchor_sum()

    def state_dict(self) -> dict[str, Any]:
        """What a recovering peer (or a checkpoint) takes: the shared state (module doc "Recovery") and whether
        this group is at its sync point."""
        return {"optimizer": self.optimizer.state_dict(), "exchange": self.exchange.state_dict(),
                "outer": self.outer.state_dict(), "outer_step": self.outer_step, "group_step_s": list(self.step_s),
                "group_local_steps": list(self.local_steps),
                "at_sync": (self.period_steps > 0 and self.due) or self.at_sync, "history": list(self.history),
                **({} if self.moments is None else {"moments": self.moments.state_dict()}),
                **({} if self.flight is None else {"in_flight": self.flight.state_dict()})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A peer's or a checkpoint's state: an elastic adaptive one, or a non-elastic adaptive run's (replica 0's
        of geotrain.sync.adaptive, `from_adaptive_state`)."""
        if "group_local_steps" not in state and "local_steps" in state:
            state = from_adaptive_state(state)
        if len(state.get("group_local_steps", ())) != self.replicas:
            raise ValueError(f"state holds no elastic adaptive outer sync of {self.replicas} replica groups")
        self.optimizer.load_state_dict(state["optimizer"])
        self.outer.load_state_dict(state["outer"])
        self.exchange.load_state_dict(state["exchange"])
        self.travel.load_state_dict(state["exchange"])  # zero residuals: a group's own
        self.outer_step = int(state["outer_step"])
        self.step_s = [float(s) for s in state["group_step_s"]]
        self.local_steps = [int(h) for h in state["group_local_steps"]]
        self.history = list(state["history"])
        self.period_steps, self.period_seconds = 0, 0.0
        self.at_sync = bool(state["at_sync"])
        if (self.moments is None) != ("moments" not in state):
            raise ValueError("state and run disagree on sync_moments (on in one, off in the other)")
        if self.moments is not None:
            self.moments.load_state_dict(state["moments"])
        self.flight = None if "in_flight" not in state else InFlight.of(state["in_flight"], self._groups)
