"""Asynchronous DiLoCo's requests and replies over TCP, for elastic runs (`--elastic --outer-sync async`):
a transport that survives the death of either end, where a gloo group spanning every process would break.

The server (`SocketServer`) listens on one TCP port; each client holds one connection and has at most one
request out. A request is (client, base, outer gradient or None, final, `acked`: the outer gradients of this
client the global model already answered, `join`: the first request on this connection); a reply is the
server's (version, updates, model, final) plus its per-client `applied` counts and every running client's base
with its process (`bases`: client -> [base, [group, incarnation]]: a copy carries the staleness bound to an elected
server; the join's `process` names it). Messages are pickled dicts of
numpy arrays (no tensor pickling: torch's would go through shared memory), framed and authenticated by
multiprocessing.connection (HMAC with the run's key).

A client whose process dies closes its connection (the kernel does, SIGKILL included): the server sees EOF and
calls OuterServer.leave (geotrain.sync.async_server), so the staleness bound, checkpoint rounds and the final
replies no longer wait for it. A server whose process dies does the same to its clients: `exchange` raises
HostLost (EOF, a reset, a refused connection), and the client elects a new host
(geotrain.runtime.elastic.async_group). No reply within `timeout_s` on an open connection is ServerSilent: the
host is alive (its kernel keeps the connection), so electing another would leave two serving. A rejoining client's `join` request carries its last base; its
outer gradient is dropped when the server's copy already holds it (`applied` > `acked`: the old server applied
it, and the copy came from a reply sent after that), so no gradient is applied twice.

Fragments (a FragmentServer, geotrain.sync.async_fragments): a request names its `fragment`, its `base` and `acked`
are lists (one per fragment; a base None: the fragment's final push is in), and a reply adds its `fragment` (-1: the
whole model), every fragment's `versions` and `counts`, and per-fragment lists in `applied` and `bases`, so a
client's copy holds each fragment as of its last reply of it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import threading
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import numpy as np
import torch

from geotrain.sync.async_fragments import FragmentServer
from geotrain.sync.async_server import OuterServer, Reply, Request


class HostLost(RuntimeError):
    """The global model's server is gone: its connection closed or reset, or refused (its process died)."""


class ServerSilent(RuntimeError):
    """The server's connection is open but no reply came within the timeout: a host that is alive but slow or
    stuck, or a peer that holds it at the staleness bound (not a reason to elect another host: two would serve)."""


def pack(message: dict[str, Any]) -> bytes:
    """A message's bytes: tensors as numpy arrays, pickled."""
    return pickle.dumps({k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in message.items()},
                        protocol=pickle.HIGHEST_PROTOCOL)


def unpack(data: bytes) -> dict[str, Any]:
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in pickle.loads(data).items()}


class SocketServer:
    """`server` served on a TCP port of `host` (`address`: (host, port)); `on_update(updates)` after each request
    that changed the model's count (called with the server's lock held)."""

    def __init__(self, server: OuterServer | FragmentServer, host: str, authkey: bytes,
                 on_update: Callable[[int], None] | None = None) -> None:
        self.server = server
        self.stopping = False
        self.listener = Listener((host, 0), authkey=authkey)
        self.address: tuple[str, int] = self.listener.address
        self.on_update = on_update
        self.lock = threading.Lock()
        self.connections: dict[int, Connection] = {}
        self.open = 0
        self.accepted: set[Connection] = set()
        """Every open connection, joined or not (`close` shuts them)."""
        self.closed = threading.Condition(self.lock)
        self.processes: dict[int, Any] = {}
        """Each client's process (its join's `process`: (group, incarnation)), sent with its base in every reply."""
        threading.Thread(target=self._accept, name="geotrain-async-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection = self.listener.accept()
            except Exception:  # noqa: BLE001 - a peer that failed the handshake: not a client of this run
                if self.stopping:
                    return
                continue
            if self.stopping:
                connection.close()
                return
            with self.lock:
                self.open += 1
                self.accepted.add(connection)
            threading.Thread(target=self._serve, args=(connection,), name="geotrain-async-client", daemon=True).start()

    def _serve(self, connection: Connection) -> None:
        client = None
        try:
            while True:
                message = unpack(connection.recv_bytes())
                with self.lock:
                    client = message["client"]
                    self._send(self._take(connection, message))
        except (EOFError, OSError):
            pass
        finally:
            connection.close()
            with self.lock:
                if client is not None and self.connections.get(client) is connection:
                    del self.connections[client]
                    self._send(self.server.leave(client))
                self.open -= 1
                self.accepted.discard(connection)
                self.closed.notify_all()

    def _take(self, connection: Connection, message: dict[str, Any]) -> list[Reply]:
        """The replies due after `message` (the lock held)."""
        client, gradient, server = message["client"], message["gradient"], self.server
        fragment = int(message.get("fragment", 0))
        replies: list[Reply] = []
        if message["join"]:
            if gradient is not None and _holds(server, client, message):
                gradient = None  # the copy already holds it
            # a newcomer that computed nothing (or whose gradient the copy holds) starts at this model; a rejoining
            # gradient keeps its base (its staleness counts against this server's versions)
            base = message["base"]
            if gradient is None and not _fragmented(server):
                base = server.version
            elif gradient is None:  # a newcomer takes every fragment as it is now, a held push that fragment only
                now = [p in (fragment, -1) or message["gradient"] is None for p in range(len(base))]
                base = [b if b is None or not new else v for b, v, new in zip(base, server.versions, now)]
            replies += server.join(client, base)
            self.connections[client] = connection
            self.processes[client] = message.get("process")
            if gradient is None and not message["final"]:  # nothing to apply: the model now, not held by the bound
                held = _fragmented(server) and message["gradient"] is not None
                return [*replies, server.current(client, fragment) if held else server.current(client)]
        before = server.updates
        count = int(message.get("count", 1))  # a region's delta carries its replicas' outer gradients
        base = server.base[client] if not _fragmented(server) else server.base[client][fragment]
        replies += server.submit(Request(client, base, gradient, count, bool(message["final"]), fragment=fragment))
        if self.on_update is not None and server.updates != before:
            self.on_update(server.updates)
        return replies

    def forget(self, client: int) -> None:
        """A client restored from a copy (its base holds the bound) whose process died before it connected: it
        leaves, as a closed connection's client."""
        with self.lock:
            if client not in self.connections and client in self.server.base:
                self._send(self.server.leave(client))

    def _send(self, replies: list[Reply]) -> None:
        if not replies:
            return
        server = self.server
        applied = dict(server.applied)
        bases = {c: [b, self.processes.get(c)] for c, b in server.base.items()}
        fragments = {} if not _fragmented(server) else \
            {"versions": server.versions, "counts": server.counts}
        for reply in replies:
            connection = self.connections.get(reply.client)
            if connection is None:
                continue
            try:
                connection.send_bytes(pack({"version": reply.version, "updates": reply.updates, "model": reply.model,
                                            "final": reply.final, "applied": applied,
                                            "bases": bases, "fragment": reply.fragment, **fragments}))
            except OSError:
                pass  # its reader sees the loss and lets it leave

    def wait_closed(self, timeout_s: float) -> bool:
        """Wait until every client's connection is closed (they close after their final reply), at most
        `timeout_s` seconds; whether they all did. Then `close`."""
        with self.lock:
            done = self.closed.wait_for(lambda: self.open == 0, timeout_s)
        self.close()
        return done

    def close(self) -> None:
        """Stop serving: the listener and every connection closed, the server's threads ended."""
        self.stopping = True
        with contextlib.suppress(OSError):  # wake the accept thread: it sees `stopping` and returns
            socket.create_connection(self.address, timeout=5).close()
        self.listener.close()
        with self.lock:
            connections = list(self.accepted)
        for connection in connections:  # a reader blocked in recv wakes with EOF
            with contextlib.suppress(OSError):
                peer = socket.socket(fileno=os.dup(connection.fileno()))
                peer.shutdown(socket.SHUT_RDWR)
                peer.close()


def _fragmented(server: Any) -> bool:
    """Whether `server` serves fragments: a FragmentServer, or one behind its interface (an elastic region's)."""
    return isinstance(server, FragmentServer) or bool(getattr(server, "fragmented", False))


def _holds(server: OuterServer | FragmentServer, client: int, message: dict[str, Any]) -> bool:
    """Whether `server`'s copy already holds the gradient of a rejoining `client`'s `message` (its applied count of
    the client passed the client's `acked`; with fragments, the pushed fragment's)."""
    applied, acked = server.applied.get(client, 0), message["acked"]
    if isinstance(acked, list):
        fragment = int(message["fragment"])
        applied, acked = (applied[fragment] if applied else 0), acked[fragment]
    return applied > acked


class SocketClient:
    """One client's connection to the server at `address`; HostLost when it cannot be opened. `timeout_s` None:
    wait for every reply however long (a host's own client: its server cannot be silent while its process runs)."""

    def __init__(self, address: tuple[str, int], authkey: bytes, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        try:
            self.connection = Client(address, authkey=authkey)
        except (OSError, EOFError) as exc:
            raise HostLost(f"cannot connect to the global model's server at {address[0]}:{address[1]}: {exc}") from None

    def exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send `message`, block for the reply (at most `timeout_s` seconds); HostLost if the server is gone."""
        try:
            self.connection.send_bytes(pack(message))
            if not self.connection.poll(self.timeout_s):
                raise ServerSilent(f"no reply from the global model's server within --comm-timeout {self.timeout_s:g} s")
            return unpack(self.connection.recv_bytes())
        except (EOFError, OSError) as exc:
            raise HostLost(f"lost the global model's server: {exc or type(exc).__name__}") from None

    def close(self) -> None:
        self.connection.close()
