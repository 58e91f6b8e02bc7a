"""Measure latency and bandwidth between every pair of processes of a torch.distributed group.

Collective: every rank calls `measure_all`, every rank gets the same matrices back.

Pairs meet in circle-method rounds (`rounds.py`): in a round each process talks to at most one
partner, so a NIC never carries two measurements at once; a barrier separates rounds.
- Latency: the lower rank of a pair sends one float and waits for it back, `pings` times after one
  warm-up; one-way latency = median round trip / 2 (ms). The minimum round trip / 2 is kept too:
  scheduling delays on a busy host only ever add, so the minimum is the robust figure for telling
  near from far (region clustering uses it), the median the typical one (the cluster file's).
- Bandwidth, each direction in turn: the sender announces a size, sends that many bytes and waits for
  a one-element acknowledgement; seconds = elapsed - the pair's median round trip; goodput =
  8 * bytes / seconds. A first (warm-up) transfer of `n_bytes` sizes the rest: when it took less
  than `min_seconds`, later transfers grow so they take about that long (at most `max_scale` x
  `n_bytes`), so fast links are timed as well as slow ones. The median of `repeats` transfers counts.
"""

from __future__ import annotations

import socket
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from geotrain.probe.rounds import circle_rounds, partner_in_round


@dataclass(frozen=True)
class ProbeConfig:
    """Sizes and counts; `n_bytes` is the first transfer of every direction."""

    pings: int = 20
    n_bytes: int = 50_000_000
    repeats: int = 3
    min_seconds: float = 0.25
    max_scale: int = 4


@dataclass(frozen=True, eq=False)
class Measurements:
    """Measured matrices (diagonal 0): latency from the median and from the minimum round trip, the
    round trips' inter-quartile range; `bandwidth_gbps_directed[i, j]`: goodput from rank i to rank j;
    `transfer_bytes[i, j]`: the size of the counted transfers i -> j; `hosts[i]`: rank i's hostname."""

    latency_ms: np.ndarray
    latency_min_ms: np.ndarray
    rtt_ms_spread: np.ndarray
    bandwidth_gbps_directed: np.ndarray
    transfer_bytes: np.ndarray
    hosts: tuple[str, ...]

    @property
    def bandwidth_gbps(self) -> np.ndarray:
        """Symmetric bandwidth: the mean of the two directions."""
        return (self.bandwidth_gbps_directed + self.bandwidth_gbps_directed.T) / 2


def _ping(peer: int, lower: bool, pings: int) -> tuple[float, float, float]:
    """(median, minimum, inter-quartile range) of round-trip seconds with `peer`; the lower rank times."""
    token = torch.zeros(1)
    rtts = []
    for k in range(pings + 1):
        if lower:
            started = time.perf_counter()
            dist.send(token, peer)
            dist.recv(token, peer)
            if k:
                rtts.append(time.perf_counter() - started)
        else:
            dist.recv(token, peer)
            dist.send(token, peer)
    if not lower:
        return 0.0, 0.0, 0.0
    quartiles = statistics.quantiles(rtts, n=4) if len(rtts) > 1 else [rtts[0]] * 3
    return statistics.median(rtts), min(rtts), quartiles[2] - quartiles[0]


def _send_timed(peer: int, payload: torch.Tensor, n_bytes: int) -> float:
    header, ack = torch.tensor([n_bytes], dtype=torch.int64), torch.zeros(1)
    dist.send(header, peer)
    started = time.perf_counter()
    dist.send(payload[:n_bytes], peer)
    dist.recv(ack, peer)
    return time.perf_counter() - started


def _receive(peer: int, payload: torch.Tensor) -> None:
    header, ack = torch.zeros(1, dtype=torch.int64), torch.zeros(1)
    dist.recv(header, peer)
    dist.recv(payload[:int(header.item())], peer)
    dist.send(ack, peer)


def _bandwidth(peer: int, sending: bool, payload: torch.Tensor, rtt_s: float, config: ProbeConfig) -> tuple[float, int]:
    """(goodput bit/s, bytes per counted transfer) of this rank -> peer when `sending`; else serve."""
    if not sending:
        for _ in range(config.repeats + 1):
            _receive(peer, payload)
        return 0.0, 0
    first_s = _send_timed(peer, payload, config.n_bytes)
    n_bytes = config.n_bytes
    if first_s < config.min_seconds:
        n_bytes = int(min(config.n_bytes * config.max_scale, config.n_bytes * config.min_seconds / max(first_s, 1e-6)))
    goodputs = []
    for _ in range(config.repeats):
        elapsed = _send_timed(peer, payload, n_bytes)
        goodputs.append(8 * n_bytes / max(elapsed - rtt_s, elapsed * 1e-3))
    return statistics.median(goodputs), n_bytes


def measure_all(config: ProbeConfig) -> Measurements:
    """Run every round of pings, then every round of transfers; all ranks get the full matrices."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rounds = circle_rounds(world)
    local = {key: torch.zeros(world, world, dtype=torch.float64) for key in ("rtt", "min", "spread", "bw", "bytes")}
    for pairs in rounds:
        meeting = partner_in_round(pairs, rank)
        if meeting is not None:
            peer, lower = meeting
            figures = _ping(peer, lower, config.pings)
            if lower:
                for key, value in zip(("rtt", "min", "spread"), figures):
                    local[key][rank, peer] = local[key][peer, rank] = value
        dist.barrier()
    dist.all_reduce(local["rtt"])
    rtt = local["rtt"].numpy()
    payload = torch.zeros(config.n_bytes * config.max_scale, dtype=torch.uint8)
    for pairs in rounds:
        meeting = partner_in_round(pairs, rank)
        if meeting is not None:
            peer, lower = meeting
            rtt_s = float(rtt[rank, peer])
            for sending in ((True, False) if lower else (False, True)):
                bps, n_bytes = _bandwidth(peer, sending, payload, rtt_s, config)
                if sending:
                    local["bw"][rank, peer], local["bytes"][rank, peer] = bps / 1e9, n_bytes
        dist.barrier()
    for key in ("min", "spread", "bw", "bytes"):
        dist.all_reduce(local[key])
    hosts: list[str | None] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    return Measurements(latency_ms=rtt / 2 * 1e3, latency_min_ms=local["min"].numpy() / 2 * 1e3,
                        rtt_ms_spread=local["spread"].numpy() * 1e3,
                        bandwidth_gbps_directed=local["bw"].numpy(), transfer_bytes=local["bytes"].numpy().astype(np.int64),
                        hosts=tuple(str(h) for h in hosts))
