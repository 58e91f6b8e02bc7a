"""How requests and replies of asynchronous DiLoCo travel (geotrain.sync.async_server holds the rule).

A server is a thread in one rank's process. Clients announce a request in the job's store (a counter
and one key per request holding the client's rank: the server reads them in arrival order, so it never
needs a receive from any source, which gloo's emulating backend does not have), then send it by gloo
point-to-point on a process group of their own; the reply comes back the same way. A client in the
server's own process hands its request over an in-process queue instead (no bytes on a link).

On emulated links (`MailboxTiming`, geotrain.sync.async_timing) the messages go over the emulating group's plain
gloo group, each carries its emulated arrival, and the server serves in emulated-time order; elsewhere it serves
in the store's order.

Deadlock-freedom: each client has at most one request out and blocks on its reply; the server takes
requests one at a time and never waits on a client that has a request out. Per process each process
group is used by one thread only (gloo's pairs are not shared between threads).

Bounded waits: a remote client's wait for its reply is a gloo receive, bounded by its group's timeout (a run's
--comm-timeout); the server's own rank waits on an in-process queue, bounded by the same `timeout_s`
(ReplyTimeout), so a replica held by a peer that is slow but alive (a staleness bound, the final exchange) ends
the run at --comm-timeout on every rank, the server's included.

Wire format, per request: float64 header [base, count, final + 2 x pause + 4 x round, has_gradient + 2 x fragment,
arrival_s], then the flat float32 gradient if any (the fragment's values: geotrain.sync.async_fragments; fragment 0 of
1 is the whole model); per reply: float64 header [version, updates, final + 2 x checkpoint, arrival_s,
sent_s] (a checkpoint round's pause and step: async_server), then the flat float32 model, the request's fragment of
it unless the reply is final (none: a final push's acknowledgement) (arrival_s, sent_s: emulated
seconds, 0 off emulated links; counts are exact in float64 below 2^53).
"""

from __future__ import annotations

import dataclasses
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from geotrain.sync.async_server import Reply, Request
from geotrain.procs.exit import exit_without_teardown
from geotrain.sync import async_timing
from geotrain.sync.async_timing import (POLL_S, AsyncStall, ClockBoard, LinkTimer, ServeOrder, next_due,
                                        stall_message)

EXIT_STALLED = 1
"""Exit status of a process whose server stalled on emulated links (async_timing.AsyncStall)."""
HEADER_VALUES = 5
"""float64 values in a request's header and in a reply's (module doc)."""
HEADER_BYTES = HEADER_VALUES * 8
REQUEST_TAG = 41
REPLY_TAG = 42
WAIT_SLICE = timedelta(seconds=300)
"""How long a server waits in the store before it checks whether it was told to stop."""


def own_store_client(store: Any) -> Any:
    """A client of `store` for one thread (torch's Store.clone); the store itself where it cannot clone."""
    try:
        return store.clone()
    except (RuntimeError, NotImplementedError):
        return store


def flat_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass(frozen=True)
class MailboxTiming:
    """A mailbox on emulated links: the emulating group's plain gloo group (`raw_group`), the timer of this
    process's client side and, on the server's rank, the server's (geotrain.sync.async_timing)."""

    raw_group: Any
    client_timer: LinkTimer
    server_timer: LinkTimer | None = None


class ReplyTimeout(RuntimeError):
    """The server's own rank waited longer than its timeout for its reply (worded as gloo's timeouts are, so a run
    names the ranks that held it up as for any collective past --comm-timeout)."""


class Mailbox:
    """The announcements of requests to one server (`name`) in the store, in arrival order, plus the
    in-process queues of the server's own rank. `sent_to`: bytes this process put on links, by peer rank;
    `timing`: on emulated links (module doc), else None; `timeout_s`: how long the server's own rank waits for a
    reply (seconds; None: no bound), as its group bounds a remote client's. `sizes`: the values of each fragment
    (geotrain.sync.async_fragments; None: one, the whole model of `numel` values)."""

    def __init__(self, store: Any, name: str, host: int, group: Any, numel: int, sent_to: Counter,
                 timing: MailboxTiming | None = None, timeout_s: float | None = None,
                 sizes: list[int] | None = None) -> None:
        # a store client per side: a TCPStore client serialises its calls, so a server blocked in `wait` would
        # hold the announcements of its own rank's client until the wait timed out
        self.client_store, self.server_store = own_store_client(store), own_store_client(store)
        self.name = name
        self.host = host
        self.group = group
        self.numel = numel
        self.sizes = [numel] if sizes is None else list(sizes)
        self.sent_to = sent_to
        self.timing = timing
        self.timeout_s = timeout_s
        self.client_board = ClockBoard(self.client_store, name)
        self.server_board = ClockBoard(self.server_store, name)
        self.local_requests: queue.Queue[tuple[float, Request]] = queue.Queue()
        self.local_replies: queue.Queue[tuple[Reply, float] | BaseException] = queue.Queue()
        self.lock = threading.Lock()

    def _count(self, peer: int, nbytes: int) -> None:
        with self.lock:
            self.sent_to[peer] += nbytes

    def _send(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        if self.timing is None:
            dist.send(tensor, peer, group=self.group, tag=tag)
        else:
            self.timing.raw_group.send([tensor], peer, tag).wait()

    def _recv(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        if self.timing is None:
            dist.recv(tensor, peer, group=self.group, tag=tag)
        else:
            self.timing.raw_group.recv([tensor], peer, tag).wait()

    def request(self, client: int, request: Request, send_s: float = 0.0,
                timer: LinkTimer | None = None) -> tuple[Reply, float]:
        """Send `request` from `client` (this process's rank, or its region server) handed to the links at emulated
        `send_s`, and block until its reply; the reply and its emulated arrival (0 off emulated links). `timer`:
        the sender's uplink (None: this process's client timer)."""
        if client == self.host:
            self.local_requests.put((send_s, request))
            self._announce(client)
            try:
                got = self.local_replies.get(timeout=self.timeout_s)
            except queue.Empty:
                raise ReplyTimeout(f"Timed out waiting {self.timeout_s * 1000:.0f}ms for the reply of the outer "
                                   "updates' server in this process (it waits for other replicas)") from None
            if isinstance(got, BaseException):
                raise got
            return got
        has_gradient = request.gradient is not None
        size = self.sizes[request.fragment]
        nbytes = HEADER_BYTES + (size * 4 if has_gradient else 0)
        arrival = 0.0
        if self.timing is not None:
            arrival = (timer or self.timing.client_timer).send(client, self.host, nbytes, send_s)
        self._announce(client)
        flags = int(request.final) + 2 * int(request.pause) + 4 * request.round
        header = torch.tensor([request.base, request.count, flags, int(has_gradient) + 2 * request.fragment, arrival],
                              dtype=torch.float64)
        self._send(header, self.host, REQUEST_TAG)
        if has_gradient:
            self._send(request.gradient.to(torch.float32).contiguous(), self.host, REQUEST_TAG)
        self._count(self.host, nbytes)
        reply_header = torch.zeros(HEADER_VALUES, dtype=torch.float64)
        self._recv(reply_header, self.host, REPLY_TAG)
        version, updates, flags = (int(v) for v in reply_header[:3])
        # a final reply holds the whole model, a final push's acknowledgement nothing (async_fragments)
        model = torch.empty(self.numel if flags % 2 else 0 if request.final else size, dtype=torch.float32)
        if model.numel():
            self._recv(model, self.host, REPLY_TAG)
        return (Reply(client, version, updates, model, bool(flags % 2), float(reply_header[4]), flags // 2,
                      request.fragment),
                float(reply_header[3]))

    def _announce(self, client: int) -> None:
        index = self.client_store.add(f"{self.name}/n", 1) - 1
        self.client_store.set(f"{self.name}/req/{index}", str(client))

    def next_request(self, index: int, stopped: threading.Event) -> tuple[float, Request] | None:
        """The `index`-th request announced and its emulated arrival (blocks; None once `stopped` is set)."""
        key = f"{self.name}/req/{index}"
        while not stopped.is_set():
            try:
                self.server_store.wait([key], WAIT_SLICE)
                break
            except Exception:  # noqa: BLE001 - the store's timeout error has no stable type across torch versions
                continue
        else:
            return None
        return self._receive(key)

    def poll_request(self, index: int) -> tuple[float, Request] | None:
        """The `index`-th request and its emulated arrival if it has been announced, else None (no wait)."""
        key = f"{self.name}/req/{index}"
        return self._receive(key) if self.server_store.check([key]) else None

    def _receive(self, key: str) -> tuple[float, Request]:
        client = int(self.server_store.get(key))
        if client == self.host:
            return self.local_requests.get()
        header = torch.zeros(HEADER_VALUES, dtype=torch.float64)
        self._recv(header, client, REQUEST_TAG)
        base, count, flags, carried = (int(v) for v in header[:4])
        gradient = None
        if carried % 2:
            gradient = torch.empty(self.sizes[carried // 2], dtype=torch.float32)
            self._recv(gradient, client, REQUEST_TAG)
        return float(header[4]), Request(client, base, gradient, count, bool(flags % 2), bool(flags // 2 % 2),
                                         flags // 4, carried // 2)

    def reply(self, reply: Reply) -> None:
        """Send `reply`; on emulated links it leaves at the server's clock."""
        timer = None if self.timing is None else self.timing.server_timer
        sent_s = 0.0 if timer is None else timer.now_s
        if reply.client == self.host:
            self.local_replies.put((dataclasses.replace(reply, sent_s=sent_s), sent_s))
            return
        nbytes = HEADER_BYTES + flat_bytes(reply.model)
        arrival = 0.0 if timer is None else timer.send(self.host, reply.client, nbytes, sent_s)
        header = torch.tensor([reply.version, reply.updates, int(reply.final) + 2 * reply.checkpoint, arrival, sent_s],
                              dtype=torch.float64)
        self._send(header, reply.client, REPLY_TAG)
        if reply.model.numel():
            self._send(reply.model.contiguous(), reply.client, REPLY_TAG)
        self._count(reply.client, nbytes)

    def fail(self, error: BaseException) -> None:
        """Hand a server's failure to the client in its own process (remote clients time out)."""
        self.local_replies.put(error)


class ServerThread(threading.Thread):
    """Serve `mailbox`'s requests with `handle(request) -> replies` until `finished()`; a failure is kept
    in `error` and handed to the local client. On emulated links: in emulated-time order (async_timing), with
    `senders()` the clients that can still send a request, and `publish(horizon_s)` (a region server's) told the
    earliest emulated time this server can still send anything upstream; `order` (a replica of several
    positions) the order every position's server serves in (async_timing.ServeOrder: the first position's server
    writes it, the others follow it); a stall there (async_timing.AsyncStall) ends the process with its message, as
    the training threads it holds are in a collective of their own."""

    def __init__(self, mailbox: Mailbox, handle: Callable[[Request], list[Reply]],
                 finished: Callable[[], bool], senders: Callable[[], list[int]] | None = None,
                 publish: Callable[[float], None] | None = None, order: ServeOrder | None = None) -> None:
        super().__init__(name=f"geotrain-async-{mailbox.name}", daemon=True)
        self.mailbox = mailbox
        self.handle = handle
        self.finished = finished
        self.senders = senders
        self.publish = publish
        self.order = order
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self.served_s: list[float] = []
        """On emulated links: the arrival (emulated s) of each request served, in the order served."""

    def run(self) -> None:
        try:
            if self.mailbox.timing is None:
                self._serve_in_store_order()
            elif self.order is not None and not self.order.lead:
                self._serve_in_leaders_order()
            else:
                self._serve_in_emulated_order()
        except AsyncStall as exc:  # the training threads are held in a collective of their own: nothing can end it
            print(f"geotrain: error: {exc}", file=sys.stderr, flush=True)
            exit_without_teardown(EXIT_STALLED, join_threads=False)
        except BaseException as exc:  # noqa: BLE001 - kept and re-raised in the training thread
            self.error = exc
            self.mailbox.fail(exc)

    def _serve(self, request: Request) -> None:
        for reply in self.handle(request):
            self.mailbox.reply(reply)

    def _serve_in_store_order(self) -> None:
        index = 0
        while not self.finished():
            got = self.mailbox.next_request(index, self.stopped)
            if got is None:
                return
            index += 1
            self._serve(got[1])

    def _serve_in_emulated_order(self) -> None:
        timing, board = self.mailbox.timing, self.mailbox.server_board
        assert timing is not None and timing.server_timer is not None and self.senders is not None
        timer = timing.server_timer
        index, pending, wait_s = 0, [], POLL_S[0]
        progress_s, last_clocks = time.monotonic(), {}
        while not self.finished():
            while (got := self.mailbox.poll_request(index)) is not None:
                index += 1
                pending.append(got)
                wait_s, progress_s = POLL_S[0], time.monotonic()
            waiting = {request.client for _, request in pending}
            senders = [c for c in self.senders() if c not in waiting]
            clocks = board.read(senders)
            if clocks != last_clocks:
                progress_s, last_clocks = time.monotonic(), clocks
            elif pending and time.monotonic() - progress_s > async_timing.STALL_S:
                raise AsyncStall(stall_message(pending, clocks, time.monotonic() - progress_s))
            horizons = [clocks[c] + timer.latency_s(c, self.mailbox.host) for c in senders]
            if self.publish is not None:
                earliest = min([arrival for arrival, _ in pending] + horizons, default=timer.now_s)
                self.publish(max(timer.now_s, earliest))
            due = next_due(pending, horizons)
            if due is None:
                if (wait_s := self._idle(wait_s)) is None:
                    return
                continue
            wait_s, progress_s = POLL_S[0], time.monotonic()
            arrival, request = pending.pop(due)
            if self.order is not None:
                self.order.record(request.client)
            self._serve_at(timer, arrival, request)

    def _serve_in_leaders_order(self) -> None:
        """Serve each request in the order the first position's server wrote (async_timing.ServeOrder), once it has
        arrived; its reply leaves at the later of its arrival and this server's clock."""
        timing, order = self.mailbox.timing, self.order
        assert timing is not None and timing.server_timer is not None and order is not None
        timer = timing.server_timer
        index, pending, wait_s, progress_s = 0, {}, POLL_S[0], time.monotonic()
        while not self.finished():
            while (got := self.mailbox.poll_request(index)) is not None:
                index += 1
                pending[got[1].client] = got
            client = order.next_client()
            if client is None or client not in pending:
                if client is not None and time.monotonic() - progress_s > async_timing.STALL_S:
                    raise AsyncStall(f"asynchronous DiLoCo on emulated links: for {async_timing.STALL_S:.0f} s the "
                                     f"server of {self.mailbox.name} waited for client {client}'s request, which the "
                                     f"first position's server has served")
                if (wait_s := self._idle(wait_s)) is None:
                    return
                continue
            wait_s, progress_s = POLL_S[0], time.monotonic()
            arrival, request = pending.pop(client)
            order.took()
            self._serve_at(timer, arrival, request)

    def _idle(self, wait_s: float) -> float | None:
        """Wait `wait_s` wall seconds with nothing to serve yet: the next wait (doubled, up to POLL_S[1]), or None once
        told to stop."""
        if self.stopped.wait(wait_s):
            return None
        return min(2 * wait_s, POLL_S[1])

    def _serve_at(self, timer: LinkTimer, arrival: float, request: Request) -> None:
        """Serve `request`, which arrived at emulated `arrival`: this server's clock moves to it (never back)."""
        timer.now_s = max(timer.now_s, arrival)
        self.served_s.append(arrival)
        self._serve(request)
