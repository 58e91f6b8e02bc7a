"""Adaptive local steps on an elastic run's torchft quorum (`train --elastic --sync-every H --local-steps adaptive`):
each live replica group takes H_g inner steps per outer period, in proportion to its measured speed
(geotrain.sync.adaptive's rule, the same `adaptive_local_steps`), and the groups meet at an outer-sync index.

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
group absent from the quorum keeps its last entry) and shares the next period's n x H inner steps among the n
groups present, by that table. A lost group thus leaves the split at the first sync without it (the survivors'
shares recomputed from their own measured speeds); a restarted group rejoins at a sync and is re-balanced there.

What speed a restarted group starts with: the last one measured for its group (the same site and GPU) before it
was lost, which the survivors kept in the shared table and hand over with the state; a group never measured (lost
in the first period) gets the prior (`prior_step_s`: 1 / its GPU's peak FLOP/s, relative) scaled by the measured
groups' mean measured / prior ratio; with no prior, the equal split. The first period is shared by the priors.

Data (`position`): the n x H inner steps of period p train the slices of the equal schedule's steps pH .. pH + H - 1
(slice s of step t: group s's part of step t's global batch), numbered i = s x H + (t - pH); the groups present, in
group order, take consecutive runs of H_g of them. With every group present that is each slice once, the equal
schedule's samples; a group's own H slices when the split is equal; with n < R groups present the slices of the
last R - n groups' share are not trained (lost samples).

Checkpoints and resume: checkpoints are written after the syncs that are due (one copy by the quorum's rank 0, as
every elastic run: runtime/elastic/checkpoint.py) and hold the shared state above (outer-sync index, measured step
seconds, split) with the writer's inner AdamW. `--resume` starts every group at that sync with that table and split,
so the resumed run's first period is the uninterrupted one's (the writer's inner steps bit for bit; the other groups'
first steps from the same parameters, then their own moments replaced by the writer's, as a recovering group's
are); later splits come from new measurements. A non-elastic adaptive run's checkpoint at an outer sync resumes too
(`from_adaptive_state`). Not built: a sync delay (overlap, rules.py refuses it).

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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.optim.outer import OuterStep
from geotrain.optim.shards import local_shard
from geotrain.sync.adaptive import adaptive_local_steps
from geotrain.sync.base import GradientSync, StepTimer, SyncError, SyncResult, free_grads, grad_carrier, set_grads


def estimated_step_s(measured: Sequence[float], prior_s: Sequence[float] | None) -> list[float]:
    """Seconds per inner step of each group: its last measured (finite, > 0), else its prior scaled by the
    measured groups' mean measured / prior ratio (none measured: the prior as it is); NaN without a prior."""
    known = [(m, p) for m, p in zip(measured, prior_s or [math.nan] * len(measured), strict=True)
             if math.isfinite(m) and m > 0 and math.isfinite(p) and p > 0]
    ratio = sum(m / p for m, p in known) / len(known) if known else 1.0  # none measured: the priors alike
    return [m if math.isfinite(m) and m > 0 else (math.nan if prior_s is None else prior_s[g] * ratio)
            for g, m in enumerate(measured)]


def quorum_split(step_s: Sequence[float], present: Sequence[int], sync_every: int) -> list[int]:
    """H_g per group (R ints, 0 for a group not `present`): the n x `sync_every` inner steps of a period shared
    among the n present groups by `adaptive_local_steps` of their `step_s` (equal if any is unknown)."""
    if not present:
        raise SyncError("elastic adaptive local steps: a quorum of no replica group")
    shares = adaptive_local_steps([step_s[g] for g in present], sync_every)
    split = [0] * len(step_s)
    for g, h in zip(present, shares, strict=True):
        split[g] = h
    return split


def period_position(period: int, index: int, sync_every: int) -> tuple[int, int]:
    """(equal-schedule step t, slice s) of inner step number `index` of period `period` (module doc "Data")."""
    return period * sync_every + index % sync_every, index // sync_every


def from_adaptive_state(state: dict[str, Any]) -> dict[str, Any]:
    """A non-elastic adaptive run's sync state (geotrain.sync.adaptive.AdaptiveOuterSync, one replica's) as this
    sync's: its outer-sync index, split (`local_steps`, this period's) and last measured step seconds per replica
    (`posted_step_s`: the period before, which its next sync shares by; none posted: not measured). ValueError
    (one line) for one this sync cannot continue: taken mid-period (a --checkpoint-every that is not a multiple of
    H), with a sync in flight (--sync-delay) or with moments (--sync-moments)."""
    if int(state["period_steps"]) != 0:
        raise ValueError(f"an adaptive checkpoint taken {state['period_steps']} steps into a period: elastic adaptive "
                         f"runs resume at outer syncs (resume a checkpoint of a step that ends an outer period)")
    if "in_flight" in state or "moments" in state:
        raise ValueError("an adaptive checkpoint with a sync in flight or moment sync: elastic adaptive syncs block "
                         "and send the outer gradients only")
    posted = state.get("posted_step_s")
    replicas = len(state["local_steps"])
    step_s = [math.nan] * replicas if posted is None else [float(s) for s in posted.reshape(-1).tolist()]
    return {"optimizer": state["optimizer"], "exchange": {}, "outer": state["outer"],
            "outer_step": int(state["outer_step"]), "group_step_s": step_s,
            "group_local_steps": [int(h) for h in state["local_steps"]], "at_sync": False,
            "history": list(state["history"])}


class ElasticAdaptiveSync(GradientSync):
    """DiLoCo with adaptive local steps over a torchft quorum (module doc). `exchange`: a ManagerExchange of
    `params` (its side sums carry presence and step seconds); `group`: this replica group (0..`replicas` - 1);
    `periods`: the run's outer periods; `prior_step_s`: relative seconds per step of each group before any is
    measured (None: the first period equal); `agree`: the group's one value of a float over its processes (a group of
    S x K > 1 processes: their max, so that every position sends the same seconds and computes the same split;
    None: this process's own)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer, outer: OuterStep,
                 exchange: Any, group: int, replicas: int, sync_every: int, periods: int,
                 prior_step_s: Sequence[float] | None = None, agree: Callable[[float], float] | None = None) -> None:
        if not 0 <= group < replicas:
            raise SyncError(f"ElasticAdaptiveSync: group must be in 0..{replicas - 1}, got {group!r}")
        if prior_step_s is not None and len(prior_step_s) != replicas:
            raise SyncError(f"ElasticAdaptiveSync: prior_step_s needs one value per group ({replicas}), got "
                            f"{list(prior_step_s)!r}")
        self.params, self.optimizer, self.outer, self.exchange = list(params), optimizer, outer, exchange
        # the outer gradients travel in shard-sized shadows (a sharded plan's DTensors: this process's shards only,
        # geotrain.optim.shards), through the exchange's quorum with the side sums
        self.shadows = [grad_carrier(local_shard(p).shape, local_shard(p).device) for p in self.params]
        self.travel = exchange.over(self.shadows)
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
        """The inner step after backward (no exchange: `outer_sync` is called at the quorum); the step's compute
        seconds are `timer.seconds` (the caller zeroes it at each step's start)."""
        with timer:
            self.optimizer.step()
        self.period_steps += 1
        self.inner_steps += 1
        self.period_seconds += float(timer.seconds)
        return SyncResult(0, None)

    def outer_sync(self, timer: StepTimer) -> int:
        """The outer sync of the current period over the quorum just started (module doc): the outer gradients'
        mean and this period's step seconds, the outer step, then the next period's split. Bytes handed to the
        exchange. StepSuperseded (geotrain.sync.elastic) if a retry's quorum handed this group a peer's state."""
        self._sync_started(self.inner_steps - 1)
        with timer:
            set_grads(self.shadows, self.outer.outer_gradients())
            side = torch.zeros(2 * self.replicas, dtype=torch.float64)
            side[self.group] = 1.0
            if self.period_steps:  # the group's processes step together: all with steps, or all without
                seconds = self.period_seconds / self.period_steps
                side[self.replicas + self.group] = seconds if self.agree is None else self.agree(seconds)
        dp_bytes = self.travel.exchange(self.outer_step, timer, side=side)
        with timer:
            self.outer.apply([s.grad for s in self.shadows])
            free_grads(self.shadows)
        summed = self.exchange.side_sum.tolist()
        present = [g for g in range(self.replicas) if summed[g] > 0]
        measured = summed[self.replicas:]
        self.step_s = [m if m > 0 else old for m, old in zip(measured, self.step_s, strict=True)]
        steps_taken = {g: self.local_steps[g] for g in present if measured[g] > 0}
        self.local_steps = quorum_split(estimated_step_s(self.step_s, self.prior_s), present, self.sync_every)
        self.history.append({"present": present, "steps": steps_taken, "step_s": list(self.step_s),
                             "next_local_steps": list(self.local_steps)})
        self.outer_step += 1
        self.period_steps, self.period_seconds, self.at_sync = 0, 0.0, False
        self._sync_landed(self.inner_steps - 1, dp_bytes)
        return dp_bytes

    def fingerprint(self) -> float:
        return self.outer.anchor_sum()

    def state_dict(self) -> dict[str, Any]:
        """What a recovering peer (or a checkpoint) takes: the shared state (module doc "Recovery") and whether
        this group is at its sync point."""
        return {"optimizer": self.optimizer.state_dict(), "exchange": self.exchange.state_dict(),
                "outer": self.outer.state_dict(), "outer_step": self.outer_step, "group_step_s": list(self.step_s),
                "group_local_steps": list(self.local_steps),
                "at_sync": (self.period_steps > 0 and self.due) or self.at_sync, "history": list(self.history)}

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
