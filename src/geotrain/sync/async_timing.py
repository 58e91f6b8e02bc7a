"""Asynchronous DiLoCo over emulated links (`geotrain emulate`, `train --time-scale`): every request and reply is
timed by the cluster's links, and a server serves requests in emulated-time order.

Why: under emulation every rank runs on this machine, so in wall time a rank that emulates a T4 sends as often as
one that emulates an A100. A server that served requests in the order they reach it in wall time would erase the
speed difference asynchronous updates exist for.

- The wire: the emulating group's plain gloo group (`EmulatedProcessGroup.inner`), which takes no emulated time, so
  a server thread never advances its rank's clock. The sender times each message itself: handed to the links at
  its emulated clock, queued on its uplink (emulate.schedule.SenderQueues: link and NIC first in, first out),
  arriving one latency after its last byte left. A request carries its arrival; a reply carries its arrival too.
  Each message is a Transfer (op "async") in its sender's records, so a step's `inter_region_bytes` count it.
- The server's clock (`LinkTimer.now_s`): the arrival of the request it served last (its optimizer step costs
  no emulated time). Replies leave then. A client's clock becomes max(its clock, its reply's arrival).
- The order (conservative, after Chandy and Misra): every client publishes its emulated clock in the store after
  each inner step (a region server publishes its horizon: the earliest it can still send upstream). The server
  serves the pending request that arrives first once every client that can still send (running, no request
  pending, not held by the staleness bound) has published clock + link latency >= that arrival: no request can
  then arrive earlier. A client blocked on its reply has a request pending or held, so the server never waits on
  it; the others' clocks advance as they compute.
- Replicas of several positions (S stages x K shards: a server per position, async_outer): one order for all.
  The first position's server (it holds rank 0) serves in emulated-time order as above and writes the order it
  served its clients in (`ServeOrder`: each request's client as an index into its clients, by replica); every other
  position's server serves its own clients' requests in that order, each once it has arrived, at its own arrival
  time. Each server is a deterministic state machine of the requests it takes, so every position holds, lets go
  and answers a replica's requests alike, and the positions' servers are one whole-model server. Why not each in
  its own emulated order: a replica's ranks agree after every reply (async_outer), so a rank whose reply came
  waits, its clock stopped, for its partners' replies from the other positions' servers; one server could wait
  for that rank's clock while the other waits for a client of its own that the first server holds (measured: 2
  runs in 3 of a 2-stage x 4-replica plan stalled). Following one order, a server waits only for what the first
  position's server has already served, which its partners have sent or will send.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from geotrain.emulate.network import EmulatedNetwork
from geotrain.emulate.schedule import SenderQueues, Transfer
from geotrain.emulate.state import EmulationState
from geotrain.sync.async_server import Request
from geotrain.sync.base import SyncError

POLL_S = (0.001, 0.032)
"""Wall seconds a server waits before it reads the clients' clocks again when no request may be served yet: the
first, doubled while nothing arrives or is served, up to the second. The wait decides no emulated time (the
order does); it only spends CPU, which `--compute-clock cpu` would count as the hosting rank's compute."""
STALL_S = 300.0
"""Wall seconds a server on emulated links waits with a request pending while no client's clock moves and nothing is
served before it gives up with AsyncStall (a loop that runs its own cross-rank collective every step: module doc)."""
ASYNC_OP = "async"
"""The Transfer op of asynchronous DiLoCo's messages in an emulating process's records."""


class AsyncStall(SyncError):
    """A server on emulated links can serve nothing: the clocks it waits for have stopped (module doc)."""


def stall_message(pending: Sequence[tuple[float, Request]], clocks: dict[int, float], waited_s: float) -> str:
    """What a stalled server says: the earliest pending request, and the clients whose clocks it waits for."""
    arrival, request = min(pending, key=lambda item: item[0])
    behind = {c: t for c, t in clocks.items() if t < arrival}
    return (f"asynchronous DiLoCo on emulated links: for {waited_s:.0f} s no request could be served: the earliest "
            f"(client {request.client}'s, arriving at emulated {arrival:.3f} s) waits for the clocks "
            f"of client(s) {sorted(behind)} (at {', '.join(f'{t:.3f}' for _, t in sorted(behind.items()))} s), which "
            f"have not moved. A loop that runs its own collective across ranks every step (a global loss all-reduce) "
            f"holds them on the rank waiting for its reply: log each rank's own values instead")


def next_due(pending: Sequence[tuple[float, Any]], horizons: Iterable[float]) -> int | None:
    """Index into `pending` ((arrival s, request) pairs) of the request to serve now: the earliest arrival, if no
    client that can still send can make one arrive before it (`horizons`: each such client's earliest possible
    arrival, s); None: wait."""
    if not pending:
        return None
    first = min(range(len(pending)), key=lambda i: pending[i][0])
    return first if pending[first][0] <= min(horizons, default=math.inf) else None


@dataclass
class LinkTimer:
    """Times the messages one side sends (a replica's client, or a server thread) and records them in its
    process's records. `queues`: its uplink's FIFO state; `now_s`: a server's clock (module doc)."""

    state: EmulationState
    queues: SenderQueues
    now_s: float = 0.0
    sent: int = 0

    @classmethod
    def of_rank(cls, state: EmulationState) -> LinkTimer:
        """A replica's client: its rank's own uplink queues (shared with its other point-to-point sends)."""
        return cls(state, state.queues)

    @classmethod
    def for_server(cls, state: EmulationState) -> LinkTimer:
        """A server thread in this process: an uplink timeline of its own (its clock is not the rank's)."""
        return cls(state, SenderQueues(state.network, state.device))

    @property
    def network(self) -> EmulatedNetwork:
        return self.state.network

    def latency_s(self, src_rank: int, dst_rank: int) -> float:
        devices = self.state.devices
        return self.network.latency(devices[src_rank], devices[dst_rank])

    def send(self, src_rank: int, dst_rank: int, nbytes: float, at_s: float) -> float:
        """Emulated arrival (s) of `nbytes` from `src_rank` to `dst_rank`, handed to the links at `at_s`."""
        devices = self.state.devices
        start, done, arrival = self.queues.send(devices[dst_rank], float(nbytes), at_s)
        if devices[src_rank] != devices[dst_rank]:
            with self.state.lock:
                self.state.transfers.append(Transfer(ASYNC_OP, self.sent, devices[src_rank], devices[dst_rank],
                                                     src_rank, dst_rank, float(nbytes), start, arrival, done))
            self.sent += 1
        return arrival


@dataclass
class ClockBoard:
    """The published emulated clocks of one server's clients in the job's store (module doc)."""

    store: Any
    name: str
    published: dict[int, float] = field(default_factory=dict)
    seen_all: bool = False

    def key(self, client: int) -> str:
        return f"{self.name}/clock/{client}"

    def publish(self, client: int, t_s: float) -> None:
        """Publish `client`'s clock `t_s` (never back: a clock set back for an evaluation keeps its bound)."""
        if t_s > self.published.get(client, -math.inf):
            self.published[client] = t_s
            self.store.set(self.key(client), repr(float(t_s)))

    def read(self, clients: Sequence[int]) -> dict[int, float]:
        """The clients' published clocks (-inf for one that has not published yet)."""
        if not clients:
            return {}
        keys = [self.key(c) for c in clients]
        if not self.seen_all:
            if not self.store.check(keys):
                return {c: (float(self.store.get(k)) if self.store.check([k]) else -math.inf)
                        for c, k in zip(clients, keys, strict=True)}
            self.seen_all = True  # keys are never deleted: every later read finds them
        return {c: float(v) for c, v in zip(clients, self.store.multi_get(keys), strict=True)}


@dataclass
class ServeOrder:
    """The order a replica of several positions' servers serve in (module doc): the first position's server
    (`lead`) writes each request's client it serves, as an index into `clients` (its clients by replica); another
    position's server reads the order and maps each index into its own `clients`."""

    store: Any
    name: str
    clients: Sequence[int]
    lead: bool
    served: int = 0

    def _key(self, index: int) -> str:
        return f"{self.name}/{index}"

    def record(self, client: int) -> None:
        """The first position's server serves `client`'s request now."""
        self.store.set(self._key(self.served), str(list(self.clients).index(client)))
        self.served += 1

    def next_client(self) -> int | None:
        """The client whose request this position's server serves next, or None while the first position's has not
        served it yet (no wait)."""
        key = self._key(self.served)
        if not self.store.check([key]):
            return None
        return self.clients[int(self.store.get(key))]

    def took(self) -> None:
        """This position's server served the request `next_client` named."""
        self.served += 1
