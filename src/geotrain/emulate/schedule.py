"""Turning traffic into emulated time: rounds of messages (collectives) and FIFO link queues (point-to-point).

A *round* is a set of messages that start together; the next round starts when the slowest message of
this one has arrived (a step of a synchronous algorithm is as slow as its slowest link). Within a round,
sender d's messages share its NIC; a message of b bytes from d to e ends at
    round_start + max(8 b / rate(d, e), 8 * (sum of d's bytes in the round) / nic(d)) + latency(d, e)
with rate(d, e) = min(bandwidth(d, e), nic(d)): every message is at least as slow as alone on its link,
and all of d's messages together at least as slow as d's NIC pushing their sum.

Point-to-point messages queue per directed link and per sender NIC, first in, first out: a message of b
bytes handed over at t starts at max(t, link free, NIC free), occupies its link for 8 b / rate and the
NIC for 8 b / nic (an unlimited NIC is never busy: messages to different peers do not wait for each
other, as with per-destination htb classes in netlab), and arrives one latency after its link time:
back-to-back messages pay the latency once (it is pipelined).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from geotrain.emulate.network import EmulatedNetwork


@dataclass(frozen=True)
class Transfer:
    """One emulated message: devices, ranks, payload bytes, emulated seconds of its start, of its last
    byte leaving (its link is busy from start_s to wire_end_s) and of its arrival (one latency later)."""

    op: str
    seq: int  # the operation's sequence number on its group (p2p: the sender's message count)
    src_device: int
    dst_device: int
    src_rank: int
    dst_rank: int
    nbytes: float
    start_s: float
    end_s: float
    wire_end_s: float

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "seq": self.seq, "src_device": self.src_device, "dst_device": self.dst_device,
                "src_rank": self.src_rank, "dst_rank": self.dst_rank, "nbytes": self.nbytes,
                "start_s": self.start_s, "end_s": self.end_s, "wire_end_s": self.wire_end_s}


def inter_region_wire(transfers: Sequence[Transfer], region_of: Sequence[int]) -> list[list[float]]:
    """[start_s, wire_end_s, bytes] of the `transfers` between devices of different regions
    (`region_of[device]`), the bytes of those that share both times summed (a round's messages), in order."""
    merged: dict[tuple[float, float], float] = {}
    for t in transfers:
        if region_of[t.src_device] != region_of[t.dst_device]:
            key = (t.start_s, t.wire_end_s)
            merged[key] = merged.get(key, 0.0) + t.nbytes
    return [[start, end, nbytes] for (start, end), nbytes in merged.items()]


def inter_region_traffic(transfers: Sequence[Transfer], region_of: Sequence[int]) -> dict[str, Any]:
    """A step record's traffic between regions: "inter_region_wire" (inter_region_wire) and
    "inter_region_bytes", their bytes."""
    wire = inter_region_wire(transfers, region_of)
    return {"inter_region_wire": wire, "inter_region_bytes": float(sum(nbytes for _, _, nbytes in wire))}


# One message of a round: (sender index, receiver index, bytes), indices into the group's member list.
Message = tuple[int, int, float]


def run_rounds(network: EmulatedNetwork, devices: Sequence[int], ranks: Sequence[int],
               rounds: Sequence[Sequence[Message]], start_s: float, op: str = "", seq: int = 0,
               ) -> tuple[list[Transfer], float]:
    """Every transfer of `rounds` among group members (member i is device devices[i], global rank
    ranks[i]) starting at `start_s`, and the emulated end of the last round."""
    transfers: list[Transfer] = []
    t = start_s
    for messages in rounds:
        sent_bytes: dict[int, float] = {}
        for src, _dst, nbytes in messages:
            sent_bytes[src] = sent_bytes.get(src, 0.0) + nbytes
        round_end = t
        for src, dst, nbytes in messages:
            d, e = devices[src], devices[dst]
            if d == e:
                continue
            alone = 8.0 * nbytes / network.rate_bps(d, e)
            shared = 8.0 * sent_bytes[src] / float(network.nic_bps[d])
            wire_end = t + max(alone, shared)
            end = wire_end + network.latency(d, e)
            transfers.append(Transfer(op, seq, d, e, ranks[src], ranks[dst], nbytes, t, end, wire_end))
            round_end = max(round_end, end)
        t = round_end
    return transfers, t


class SenderQueues:
    """One sender's FIFO state: when each outgoing link and its NIC become free (emulated seconds)."""

    def __init__(self, network: EmulatedNetwork, device: int) -> None:
        self.network = network
        self.device = device
        self.nic_free_s = float("-inf")
        self.link_free_s: dict[int, float] = {}

    def send(self, dst_device: int, nbytes: float, handoff_s: float) -> tuple[float, float, float]:
        """(start, end of serialisation, arrival) of `nbytes` handed over at `handoff_s`."""
        if dst_device == self.device:
            return handoff_s, handoff_s, handoff_s
        start = max(handoff_s, self.nic_free_s, self.link_free_s.get(dst_device, float("-inf")))
        done = start + 8.0 * nbytes / self.network.rate_bps(self.device, dst_device)
        # The NIC is busy for the message at its own rate (an unlimited NIC: not at all), so messages
        # to other peers are not held behind a slow link's serialisation.
        self.nic_free_s = start + 8.0 * nbytes / float(self.network.nic_bps[self.device])
        self.link_free_s[dst_device] = done
        return start, done, done + self.network.latency(self.device, dst_device)
