"""Check a lab's links from the outside: TCP goodput and round-trip time between two lab devices,
and a configured-vs-measured table with one row per link class (inside a region, between two regions).

Uses the standard-library `tcpbench.py` (one process per end, started inside the namespaces), so it
needs neither torch nor iperf.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from geotrain.netlab import tcpbench
from geotrain.netlab.lab import NetLab
from geotrain.netlab.tcpbench import StreamResult

TCPBENCH = str(Path(tcpbench.__file__))
BENCH_PORT = 5201


@dataclass(frozen=True)
class LinkCheck:
    """Configured vs measured figures of one link class, measured on one ordered rank pair."""

    label: str
    sender: int
    receiver: int
    configured_gbps: float
    measured_gbps: float
    configured_ms: float
    measured_ms: float
    n_bytes: int


def _server(lab: NetLab, rank: int, mode: str, *args: str) -> subprocess.Popen:
    server = lab.run(rank, [sys.executable, TCPBENCH, mode, lab.devices[rank].address, str(BENCH_PORT), *args],
                     stdout=subprocess.PIPE, text=True)
    if server.stdout.readline().strip() != "ready":
        server.kill()
        server.wait()
        raise RuntimeError(f"tcpbench {mode} in rank {rank} did not start")
    return server


def _finish(server: subprocess.Popen, timeout_s: float) -> str:
    try:
        return server.communicate(timeout=timeout_s)[0]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def measure_stream(lab: NetLab, sender: int, receiver: int, n_bytes: int, timeout_s: float = 60.0) -> StreamResult:
    """Goodput of one TCP stream of `n_bytes` from lab rank `sender` to rank `receiver`."""
    server = _server(lab, receiver, "recv")
    address = lab.devices[receiver].address
    client = lab.run(sender, [sys.executable, TCPBENCH, "send", address, str(BENCH_PORT), str(n_bytes)])
    client.wait(timeout=timeout_s)
    doc = json.loads(_finish(server, timeout_s).strip().splitlines()[-1])
    return StreamResult(bytes=doc["bytes"], seconds=doc["seconds"])


def measure_rtt_s(lab: NetLab, sender: int, receiver: int, count: int = 20, timeout_s: float = 60.0) -> float:
    """Median round-trip seconds of one-byte TCP exchanges between two lab ranks."""
    server = _server(lab, receiver, "echo")
    address = lab.devices[receiver].address
    client = lab.run(sender, [sys.executable, TCPBENCH, "ping", address, str(BENCH_PORT), str(count)],
                     stdout=subprocess.PIPE, text=True)
    out, _ = client.communicate(timeout=timeout_s)
    _finish(server, timeout_s)
    return statistics.median(json.loads(out))


def measure_messages_s(lab: NetLab, sender: int, receiver: int, n_bytes: int, count: int = 3,
                       idle_s: float = 0.3, timeout_s: float = 60.0) -> list[float]:
    """Seconds per message of `n_bytes` from rank `sender` to `receiver` (hand-off to the receiver's
    one-byte ack), each sent after `idle_s` of silence: what a link lets through at once after an
    idle spell (a message alone should take about 8 n_bytes / rate)."""
    server = _server(lab, receiver, "sink", str(n_bytes))
    address = lab.devices[receiver].address
    client = lab.run(sender, [sys.executable, TCPBENCH, "message", address, str(BENCH_PORT), str(n_bytes), str(count),
                              str(idle_s)], stdout=subprocess.PIPE, text=True)
    out, _ = client.communicate(timeout=timeout_s)
    _finish(server, timeout_s)
    return json.loads(out)


def link_classes(lab: NetLab) -> list[tuple[str, int, int]]:
    """(label, sender rank, receiver rank): the first rank pair of every region pair in the lab."""
    names = lab.topology.region_names
    seen: dict[tuple[int, int], tuple[int, int]] = {}
    for a in lab.devices:
        for b in lab.devices:
            key = (min(a.region, b.region), max(a.region, b.region))
            if a.rank != b.rank and key not in seen:
                seen[key] = (a.rank, b.rank)
    return [(f"inside {names[ga]}" if ga == gb else f"{names[ga]} <-> {names[gb]}", s, r)
            for (ga, gb), (s, r) in sorted(seen.items())]


def check_links(lab: NetLab, seconds_per_transfer: float = 0.5, pings: int = 20) -> list[LinkCheck]:
    """Configured vs measured bandwidth and latency (one-way = RTT / 2) per link class; each transfer
    is sized to take about `seconds_per_transfer` at the configured rate."""
    rows = []
    for label, sender, receiver in link_classes(lab):
        rate_bps = float(lab.topology.rate_bps[sender, receiver])
        n_bytes = max(1 << 20, int(rate_bps * seconds_per_transfer / 8))
        stream = measure_stream(lab, sender, receiver, n_bytes)
        rtt_s = measure_rtt_s(lab, sender, receiver, pings)
        rows.append(LinkCheck(label, sender, receiver, rate_bps / 1e9, stream.bps / 1e9,
                              float(lab.topology.delay_s[sender, receiver]) * 1e3, rtt_s / 2 * 1e3, n_bytes))
    return rows
