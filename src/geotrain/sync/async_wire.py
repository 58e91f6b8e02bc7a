"""How requests and replies of asynchronous DiLoCo travel (geotrain.sync.async_server holds the rule).

A server is a thread in one rank's process. Clients announce a request in the job's store (a counter
and one key per request holding the client's rank: the server reads them in arrival order, so it never
needs a receive from any source, which gloo's emulating backend does not have), then send it by gloo
point-to-point on a process group of their own; the reply comes back the same way. A client in the
server's own process hands its request over an in-process queue instead (no bytes on a link).

Deadlock-freedom: each client has at most one request out and blocks on its reply; the server takes
requests one at a time in the store's order and never waits on a client that has a request out. Per
process each process group is used by one thread only (gloo's pairs are not shared between threads).

Wire format, per request: int64 header [base, count, final, has_gradient], then the flat float32
gradient if any; per reply: int64 header [version, updates, final], then the flat float32 model.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from geotrain.sync.async_server import Reply, Request

REQUEST_TAG = 41
REPLY_TAG = 42
WAIT_SLICE = timedelta(seconds=300)
"""How long a server waits in the store before it checks whether it was told to stop."""


def _own_client(store: Any) -> Any:
    """A client of `store` for one thread (torch's Store.clone); the store itself where it cannot clone."""
    try:
        return store.clone()
    except (RuntimeError, NotImplementedError):
        return store


def flat_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class Mailbox:
    """The announcements of requests to one server (`name`) in the store, in arrival order, plus the
    in-process queues of the server's own rank. `sent_to`: bytes this process put on links, by peer rank."""

    def __init__(self, store: Any, name: str, host: int, group: Any, numel: int, sent_to: Counter) -> None:
        # a store client per side: a TCPStore client serialises its calls, so a server blocked in `wait` would
        # hold the announcements of its own rank's client until the wait timed out
        self.client_store, self.server_store = _own_client(store), _own_client(store)
        self.name = name
        self.host = host
        self.group = group
        self.numel = numel
        self.sent_to = sent_to
        self.local_requests: queue.Queue[Request] = queue.Queue()
        self.local_replies: queue.Queue[Reply | BaseException] = queue.Queue()
        self.lock = threading.Lock()

    def _count(self, peer: int, nbytes: int) -> None:
        with self.lock:
            self.sent_to[peer] += nbytes

    def request(self, client: int, request: Request) -> Reply:
        """Send `request` from `client` (this process's rank) and block until its reply."""
        if client == self.host:
            self.local_requests.put(request)
            self._announce(client)
            reply = self.local_replies.get()
            if isinstance(reply, BaseException):
                raise reply
            return reply
        self._announce(client)
        has_gradient = request.gradient is not None
        header = torch.tensor([request.base, request.count, int(request.final), int(has_gradient)], dtype=torch.int64)
        dist.send(header, self.host, group=self.group, tag=REQUEST_TAG)
        self._count(self.host, flat_bytes(header))
        if has_gradient:
            gradient = request.gradient.to(torch.float32).contiguous()
            dist.send(gradient, self.host, group=self.group, tag=REQUEST_TAG)
            self._count(self.host, flat_bytes(gradient))
        reply_header = torch.zeros(3, dtype=torch.int64)
        dist.recv(reply_header, self.host, group=self.group, tag=REPLY_TAG)
        model = torch.empty(self.numel, dtype=torch.float32)
        dist.recv(model, self.host, group=self.group, tag=REPLY_TAG)
        version, updates, final = (int(v) for v in reply_header)
        return Reply(client, version, updates, model, bool(final))

    def _announce(self, client: int) -> None:
        index = self.client_store.add(f"{self.name}/n", 1) - 1
        self.client_store.set(f"{self.name}/req/{index}", str(client))

    def next_request(self, index: int, stopped: threading.Event) -> Request | None:
        """The `index`-th request announced (blocks; None once `stopped` is set)."""
        key = f"{self.name}/req/{index}"
        while not stopped.is_set():
            try:
                self.server_store.wait([key], WAIT_SLICE)
                break
            except Exception:  # noqa: BLE001 - the store's timeout error has no stable type across torch versions
                continue
        else:
            return None
        client = int(self.server_store.get(key))
        if client == self.host:
            return self.local_requests.get()
        header = torch.zeros(4, dtype=torch.int64)
        dist.recv(header, client, group=self.group, tag=REQUEST_TAG)
        base, count, final, has_gradient = (int(v) for v in header)
        gradient = None
        if has_gradient:
            gradient = torch.empty(self.numel, dtype=torch.float32)
            dist.recv(gradient, client, group=self.group, tag=REQUEST_TAG)
        return Request(client, base, gradient, count, bool(final))

    def reply(self, reply: Reply) -> None:
        if reply.client == self.host:
            self.local_replies.put(reply)
            return
        header = torch.tensor([reply.version, reply.updates, int(reply.final)], dtype=torch.int64)
        dist.send(header, reply.client, group=self.group, tag=REPLY_TAG)
        dist.send(reply.model.contiguous(), reply.client, group=self.group, tag=REPLY_TAG)
        self._count(reply.client, flat_bytes(header) + flat_bytes(reply.model))

    def fail(self, error: BaseException) -> None:
        """Hand a server's failure to the client in its own process (remote clients time out)."""
        self.local_replies.put(error)


class ServerThread(threading.Thread):
    """Serve `mailbox`'s requests with `handle(request) -> replies` until `finished()`; a failure is kept
    in `error` and handed to the local client."""

    def __init__(self, mailbox: Mailbox, handle: Callable[[Request], list[Reply]],
                 finished: Callable[[], bool]) -> None:
        super().__init__(name=f"geotrain-async-{mailbox.name}", daemon=True)
        self.mailbox = mailbox
        self.handle = handle
        self.finished = finished
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        index = 0
        try:
            while not self.finished():
                request = self.mailbox.next_request(index, self.stopped)
                if request is None:
                    return
                index += 1
                for reply in self.handle(request):
                    self.mailbox.reply(reply)
        except BaseException as exc:  # noqa: BLE001 - kept and re-raised in the training thread
            self.error = exc
            self.mailbox.fail(exc)
