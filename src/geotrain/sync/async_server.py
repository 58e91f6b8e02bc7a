"""The global model of asynchronous DiLoCo and the rule that applies arrivals to it (no communication).

A client (a replica, or a region's server in the hierarchical variant) sends a request: the version of
the global model it started from (`base`), its outer gradient (None: nothing to add) and whether it is
its last (`final`). The server applies it with the outer optimizer (geotrain.optim.delayed_nesterov) and
replies with the new model and version, at once: other clients are not waited for.

Staleness bound S: an arrival's staleness is `version - base` (updates applied since its client took its
model); none is applied with staleness > S. Clients are therefore held, never dropped: while some
client still computing started S updates ago, an arrival from a faster one waits (stale synchronous
parallel). When every client at the oldest base has arrived and the bound is tight, they are applied
together as one update (the mean of their gradients, as a synchronous step), so waiting cannot go round
in a circle: some request can always be applied, or a client still computing will arrive. A final
request is applied like any other; its reply waits until every client has sent its final one, and all of
them get the same final model.

`updates` counts the replicas' outer gradients folded into the model (a hierarchical region's request
carries how many it merged): the `outer_step` the replicas see. A `budget` (a run's: replicas x its
periods) caps them: a gradient that arrives once `updates` reached it is not applied (`discarded`), so
the replicas still mid-period when the budget was spent do not add tokens to the final model; its
replica stops at the reply. A batch (or a region's delta) that starts below the budget is applied whole.

Checkpoint rounds (`pauses`: (updates, step) pairs, a run's checkpoints): once `updates` reaches a pair's count
a round opens, and every reply says so (`checkpoint`: the step it is named by). A client told so sends a pause
request (no gradient) right after that reply, at the start of a period; while it is paused it does not count
for the staleness bound (it computes nothing from its base meanwhile), so the others' requests go on being
applied, and when every running client is paused they are all told to go on at once (the reply to the pause:
model and version unchanged for the client), with the step of the last pause the model has reached by then. Between
that go and their next requests the server holds no request: the clients write their checkpoint then, and the
server's `state_dict` with it (rank 0's).

Regions (a `relay` server: a region's, geotrain.sync.async_region): its round opens when its own count reaches a pause
or when the global server's reply names one (`join_round`); once all its clients are paused it does not let them go
itself: the region pauses at the global server (a pause request naming its round), and `release` lets them go with
the step the global server's go names. A pause request's `round` opens that round at the server it reaches, so the
other clients (regions) are told at their next reply; the go names the largest round any paused client paused for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.optim.delayed_nesterov import DelayedNesterov
from geotrain.sync.base import SyncError


@dataclass(frozen=True)
class Request:
    """One arrival: `client` id, `base` version its model came from, `gradient` (flat fp32, or None),
    `count` replica outer gradients merged in it, `final` (the client stops after this one)."""

    client: int
    base: int
    gradient: torch.Tensor | None
    count: int = 1
    final: bool = False
    pause: bool = False  # a checkpoint round's pause (module doc): no gradient, base unchanged
    round: int = 0  # a pause's round: the step of the checkpoint it pauses for (module doc)
    fragment: int = 0  # the fragment of the model it pushes (geotrain.sync.async_fragments; 0: the whole model)


@dataclass(frozen=True)
class Reply:
    """What a client gets back: the model after `version` applied updates holding `updates` replica outer gradients;
    `sent_s`: the emulated second its server sent it (the model's time; 0 off emulated links)."""

    client: int
    version: int
    updates: int
    model: torch.Tensor
    final: bool
    sent_s: float = 0.0
    checkpoint: int = 0
    """The open checkpoint round's step (module doc); 0: none. On the reply to a pause: the round that closed."""
    fragment: int = 0
    """The fragment `model` holds (geotrain.sync.async_fragments); a final reply holds the whole model."""


class OuterServer:
    """The global model (flat fp32), its outer optimizer and the staleness rule (module doc)."""

    def __init__(self, model: torch.Tensor, optimizer: DelayedNesterov, clients: list[int],
                 staleness_bound: int, budget: int | None = None, pauses: Sequence[tuple[int, int]] = (),
                 relay: bool = False) -> None:
        if not isinstance(staleness_bound, int) or isinstance(staleness_bound, bool) or staleness_bound < 0:
            raise SyncError(f"asynchronous DiLoCo: staleness_bound must be an integer >= 0, got {staleness_bound!r}")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
            raise SyncError(f"asynchronous DiLoCo: budget must be an integer >= 1 or None, got {budget!r}")
        self.budget = budget
        """Replica outer gradients the model takes at most (a run's budget): later ones are not applied."""
        self.discarded = 0
        """Replica outer gradients that arrived once the budget was spent (their replicas stop at the reply)."""
        self.model = model.detach().to(torch.float32).clone()
        self.optimizer = optimizer
        self.staleness_bound = staleness_bound
        self.version = 0
        self.updates = 0
        self.base = {client: 0 for client in clients}
        """Version each client still running last received."""
        self.waiting: list[Request] = []
        self.done: list[int] = []
        self.applied: dict[int, int] = {client: 0 for client in clients}
        self.max_staleness = 0
        self.pauses = sorted(pauses)
        """(updates, step) of the checkpoint rounds still to open (module doc)."""
        self.round = 0
        self.closed = 0
        """The step of the last round that let its clients go (a later request naming it opens nothing)."""
        self.relay = relay
        """A region's server (module doc): all its clients paused, it waits for `release`."""
        self.paused: list[Request] = []
        self._open_round()

    def senders(self) -> list[int]:
        """The clients that can still send a request: running, not held by the staleness bound, not paused."""
        held = {r.client for r in self.waiting + self.paused}
        return [c for c in self.base if c not in held]

    def submit(self, request: Request) -> list[Reply]:
        """Take one request; apply every request the bound lets through; the replies due now."""
        if request.client not in self.base:
            raise SyncError(f"asynchronous DiLoCo: request from client {request.client}, which is not running "
                            f"(running: {sorted(self.base)})")
        if request.base != self.base[request.client]:
            raise SyncError(f"asynchronous DiLoCo: client {request.client} sent base {request.base}, "
                            f"but was given version {self.base[request.client]}")
        if request.pause:
            self.paused.append(request)
            self.join_round(request.round)
        else:
            self.waiting.append(request)
        return self._drain()

    def _drain(self) -> list[Reply]:
        """Apply every waiting request the bound lets through; the replies due now (checkpoint goes, finals)."""
        replies: list[Reply] = []
        while self.waiting:
            batch = self._next_batch()
            if not batch:
                break
            replies.extend(self._apply(batch))
        if self.all_paused() and not self.relay:  # every running client paused: go
            replies.extend(self.release(self.closing_round()))
        if not self.base and self.done:  # every client has finished: all get the final model
            replies.extend(self._reply(client, final=True) for client in self.done)
            self.done = []
        return replies

    def start_from(self, version: int, updates: int, applied: dict[int, int],
                   bases: Mapping[int, int] | None = None) -> None:
        """Take up a copy of the global model (elastic runs: the freshest replica's, elected): its `version`,
        `updates` and per-client `applied` counts, and the `bases` of the clients still running (the copy's,
        those alive: each holds the bound as it did at the lost server, from at most this version) before any
        of them joins."""
        self.version, self.updates, self.applied = version, updates, dict(applied)
        self.base = {client: min(base, version) for client, base in (bases or {}).items()}

    def join(self, client: int, base: int) -> list[Reply]:
        """A client that (re)connects (elastic runs): running from version `base` (at most this model's: a
        copy elected after the client's last reply may be older); any earlier place of it is forgotten (the
        replies that lets through are returned)."""
        self._forget(client)
        self.base[client] = min(base, self.version)  # set before the drain: a restored base holds the bound meanwhile
        self.applied.setdefault(client, 0)
        return self._drain()

    def current(self, client: int) -> Reply:
        """The model as it is now, for a running `client` that sends nothing (a joining one)."""
        return self._reply(client, final=False)

    def leave(self, client: int) -> list[Reply]:
        """A client that is gone (its process died): no longer waited for by the staleness bound, a checkpoint
        round or the final replies; the replies its absence lets through."""
        self.base.pop(client, None)
        self._forget(client)
        return self._drain()

    def _forget(self, client: int) -> None:
        """Drop `client`'s waiting or paused request and its place among the finished."""
        self.waiting = [r for r in self.waiting if r.client != client]
        self.paused = [r for r in self.paused if r.client != client]
        self.done = [c for c in self.done if c != client]

    def all_paused(self) -> bool:
        """Every running client waits at a checkpoint round (module doc)."""
        return bool(self.paused) and {r.client for r in self.paused} == set(self.base)

    def closing_round(self) -> int:
        """The step a round closing now is named by: the last pause the model has reached meanwhile (the others'
        updates went on), or the largest round a client paused for."""
        reached = [step for updates, step in self.pauses if self.updates >= updates]
        return max([self.round, *reached, *(r.round for r in self.paused)])

    def release(self, step: int) -> list[Reply]:
        """Let every paused client go (model and version unchanged for it), the round named `step`; the rounds up to
        it are closed, and one the count has already passed opens at once."""
        self.round, self.closed = 0, max(self.closed, step)
        self.pauses = [pair for pair in self.pauses if pair[1] > step]
        go = [Reply(r.client, self.version, self.updates, self.model.clone(), False, checkpoint=step)
              for r in self.paused]
        self.paused = []
        self._open_round()
        return go

    def close_through(self, step: int) -> None:
        """The rounds through `step` are closed (a round named `step` by its clients' agreement, after it let them
        go): none of them opens again."""
        self.closed = max(self.closed, step)
        self.pauses = [pair for pair in self.pauses if pair[1] > step]

    def join_round(self, step: int) -> None:
        """Open the round of `step` (a pause's, or the global server's reply to a region: module doc) unless it
        has closed, and then the round of any pause the count has reached."""
        if step > max(self.round, self.closed):
            self.round = step
            self.pauses = [pair for pair in self.pauses if pair[1] > step]
        self._open_round()

    def _next_batch(self) -> list[Request]:
        """The requests to apply next as one update (empty: wait for a client still computing)."""
        paused = {r.client for r in self.paused}
        running = [b for c, b in self.base.items() if c not in paused]
        if not running:
            return [self.waiting[0]]
        oldest = min(running)
        if self.version - oldest < self.staleness_bound:
            return [self.waiting[0]]  # one more update keeps every client within the bound
        waiting_clients = {r.client for r in self.waiting}
        if any(b == oldest and c not in waiting_clients and c not in paused for c, b in self.base.items()):
            return []  # a client computing since `oldest` would go past the bound
        return [r for r in self.waiting if r.base == oldest]

    def _apply(self, batch: list[Request]) -> list[Reply]:
        gradients = [r.gradient for r in batch if r.gradient is not None]
        if gradients and self.budget is not None and self.updates >= self.budget:
            self.discarded += sum(r.count for r in batch if r.gradient is not None)
            gradients = []
        if gradients:
            staleness = self.version - min(r.base for r in batch)
            self.max_staleness = max(self.max_staleness, staleness)
            self.optimizer.step(self.model, torch.stack(gradients).mean(dim=0), staleness)
            self.version += 1
            self.updates += sum(r.count for r in batch if r.gradient is not None)
            self._open_round()
        replies = []
        for request in batch:
            self.waiting.remove(request)
            self.applied[request.client] += request.gradient is not None and bool(gradients)
            if request.final:
                del self.base[request.client]
                self.done.append(request.client)
            else:
                self.base[request.client] = self.version
                replies.append(self._reply(request.client, final=False))
        return replies

    def _reply(self, client: int, final: bool) -> Reply:
        return Reply(client, self.version, self.updates, self.model.clone(), final, checkpoint=self.round)

    def plan_pauses(self, pauses: Sequence[tuple[int, int]]) -> None:
        """Set the checkpoint rounds still to open ((updates, step) pairs; those at or before an open round's
        step are dropped); before any client sends its first request."""
        self.pauses = sorted(pair for pair in pauses if pair[1] > max(self.round, self.closed))
        self._open_round()

    def _open_round(self) -> None:
        """Open the checkpoint round of the last pause whose updates are reached (none while one is open, and none
        once the budget is spent: a client may then have sent its final request, and could not pause)."""
        if self.budget is not None and self.updates >= self.budget:
            self.pauses = []
        while not self.round and self.pauses and self.updates >= self.pauses[0][0]:
            crossed = [step for updates, step in self.pauses if self.updates >= updates]
            self.pauses = [pair for pair in self.pauses if self.updates < pair[0]]
            self.round = crossed[-1]

    def state_dict(self) -> dict[str, Any]:
        """The global model, its version, updates and outer momentum, and every client's base (between a
        checkpoint round's go and the next request: nothing waiting)."""
        if self.waiting or self.paused:
            raise SyncError("asynchronous DiLoCo: the server's state with requests waiting (outside a checkpoint)")
        return {**self.model_state(), "base": [[c, b] for c, b in sorted(self.base.items())],
                "round": self.round, "closed": self.closed}

    def model_state(self) -> dict[str, Any]:
        """The global model's own state, whatever waits: the model, its version, updates, per-client applied counts
        and outer optimizer (an elastic run's checkpoint: its clients start afresh from it, and the requests waiting
        now are lost as those computing are)."""
        return {"model": self.model.clone(), "version": self.version, "updates": self.updates,
                "applied": [[c, n] for c, n in sorted(self.applied.items())], "max_staleness": self.max_staleness,
                "discarded": self.discarded, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.copy_(state["model"])
        self.version, self.updates = int(state["version"]), int(state["updates"])
        base = {int(c): int(b) for c, b in state["base"]}
        if set(base) != set(self.base):
            raise ValueError(f"checkpoint's asynchronous clients {sorted(base)} are not this run's {sorted(self.base)}")
        self.base = base
        self.applied = {int(c): int(n) for c, n in state["applied"]}
        self.max_staleness, self.discarded = int(state["max_staleness"]), int(state["discarded"])
        self.round, self.closed = int(state["round"]), int(state.get("closed", 0))
        self.optimizer.load_state_dict(state["optimizer"])
