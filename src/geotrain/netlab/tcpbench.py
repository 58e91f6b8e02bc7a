"""A minimal iperf: one TCP stream of N bytes between two lab devices, goodput measured by the receiver.

    python tcpbench.py recv ADDRESS PORT       # prints "ready", then one JSON line
    python tcpbench.py send ADDRESS PORT BYTES
    python tcpbench.py echo ADDRESS PORT       # prints "ready", echoes one connection's bytes
    python tcpbench.py ping ADDRESS PORT COUNT # prints a JSON list of round-trip seconds
    python tcpbench.py sink ADDRESS PORT BYTES           # prints "ready", acks every BYTES received
    python tcpbench.py message ADDRESS PORT BYTES COUNT IDLE_S   # JSON list of seconds per message

Standard library only, run as a file (not `-m`), so that a measurement starts in milliseconds.

The receiver times from its first received byte to the last (connection setup excluded) and counts
the bytes after the first chunk, so the result is the stream's steady goodput in bit/s: TCP/IP and
Ethernet headers are not counted (about 4.5% of a 1500-byte frame), as an application sees it.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from dataclasses import dataclass

CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class StreamResult:
    """One measured transfer: payload bytes counted, seconds, goodput in bit/s."""

    bytes: int
    seconds: float
    started: float = 0.0  # time.monotonic() of the first byte (comparable across processes)

    @property
    def bps(self) -> float:
        return 8 * self.bytes / self.seconds


def receive_once(address: str, port: int) -> StreamResult:
    with socket.create_server((address, port)) as server:
        print("ready", flush=True)
        connection, _ = server.accept()
        with connection:
            first = connection.recv(CHUNK_BYTES)
            started = time.monotonic()
            counted = 0
            while chunk := connection.recv(CHUNK_BYTES):
                counted += len(chunk)
            elapsed = time.monotonic() - started
    return StreamResult(bytes=counted, seconds=elapsed if first else float("nan"), started=started)


def send_once(address: str, port: int, n_bytes: int) -> None:
    payload = memoryview(bytes(CHUNK_BYTES))
    with socket.create_connection((address, port), timeout=60) as connection:
        left = n_bytes
        while left > 0:
            connection.sendall(payload[:min(left, CHUNK_BYTES)])
            left -= CHUNK_BYTES


def echo_once(address: str, port: int) -> None:
    with socket.create_server((address, port)) as server:
        print("ready", flush=True)
        connection, _ = server.accept()
        with connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while byte := connection.recv(1):
                connection.sendall(byte)


def ping(address: str, port: int, count: int) -> list[float]:
    """Round-trip seconds of `count` one-byte exchanges (after one warm-up exchange)."""
    rtts = []
    with socket.create_connection((address, port), timeout=60) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for k in range(count + 1):
            started = time.perf_counter()
            connection.sendall(b"x")
            connection.recv(1)
            if k:
                rtts.append(time.perf_counter() - started)
    return rtts


def sink(address: str, port: int, n_bytes: int) -> None:
    """Accept one connection; after every `n_bytes` received, send one byte back."""
    with socket.create_server((address, port)) as server:
        print("ready", flush=True)
        connection, _ = server.accept()
        with connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pending = n_bytes
            while chunk := connection.recv(min(pending, CHUNK_BYTES)):
                pending -= len(chunk)
                if pending == 0:
                    connection.sendall(b"k")
                    pending = n_bytes


def messages(address: str, port: int, n_bytes: int, count: int, idle_s: float) -> list[float]:
    """Seconds from handing each of `count` messages of `n_bytes` to the socket until the sink's
    one-byte ack is back, each after `idle_s` of silence (a link's idle bucket refills meanwhile)."""
    payload = bytes(n_bytes)
    seconds = []
    with socket.create_connection((address, port), timeout=60) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            time.sleep(idle_s)
            started = time.perf_counter()
            connection.sendall(payload)
            connection.recv(1)
            seconds.append(time.perf_counter() - started)
    return seconds


def main(argv: list[str]) -> int:
    if argv[:1] == ["recv"] and len(argv) == 3:
        result = receive_once(argv[1], int(argv[2]))
        print(json.dumps({"bytes": result.bytes, "seconds": result.seconds, "started": result.started}), flush=True)
        return 0
    if argv[:1] == ["send"] and len(argv) == 4:
        send_once(argv[1], int(argv[2]), int(argv[3]))
        return 0
    if argv[:1] == ["echo"] and len(argv) == 3:
        echo_once(argv[1], int(argv[2]))
        return 0
    if argv[:1] == ["ping"] and len(argv) == 4:
        print(json.dumps(ping(argv[1], int(argv[2]), int(argv[3]))), flush=True)
        return 0
    if argv[:1] == ["sink"] and len(argv) == 4:
        sink(argv[1], int(argv[2]), int(argv[3]))
        return 0
    if argv[:1] == ["message"] and len(argv) == 6:
        print(json.dumps(messages(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), float(argv[5]))), flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
