"""How a gathered payload travels: gloo's ring all-gather, or one round of direct sends (all-to-all).

Codecs whose payloads cannot be summed compressed (int8-block, int4-block, top-k, ...) are gathered:
every member must receive every other member's payload. Two algorithms deliver exactly the same bytes
((n - 1) x payload sent and received per member), in different numbers of rounds:
- "ring": gloo's ring all-gather, n - 1 rounds; in each, member i sends one payload to i + 1 and the
  round lasts as long as the ring's slowest hop (latency + serialisation);
- "direct": one all-to-all round (`all_to_all_single` of the payload repeated n times): member i sends
  its payload to every peer at once, so the round lasts one (largest) latency plus the serialisation of
  n - 1 payloads through i's NIC (or one payload through the slowest link, whichever is longer).

Seconds, by the emulator's round model (geotrain.emulate.schedule.run_rounds; a unit test holds the
two together), with lat / rate / nic the members' one-way latency (s), link rate (bit/s, capped by the
sender's NIC) and NIC uplink (bit/s), p the payload bytes:
    ring   = (n - 1) x max_i (lat(i, i+1) + 8 p / rate(i, i+1))
    direct = max_{i != j} (lat(i, j) + max(8 p / rate(i, j), 8 (n - 1) p / nic(i)))
Latency-bound links (small payloads, 50-150 ms): direct pays one latency instead of n - 1 (3x on 4
sites). Bandwidth-bound through a NIC: both serialise (n - 1) p, and the ring is never faster in this
model; a real fabric with a shared core favours the ring there, which the rule cannot see, so ties go
to the ring. `GatherLinks.algorithm(p)` is the one rule: the runtime's codec reducer asks it per
exchange, and the WAN recipe's cost model (geotrain.cost.wan_recipe) prices what it chooses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from geotrain.cluster import Cluster

GATHER_ALGORITHMS = ("ring", "direct")


@dataclass(frozen=True, eq=False)
class GatherLinks:
    """The links among the members of one group, in group-rank order: one-way latency (s), the rate one
    message alone gets (bit/s: min(link, sender NIC)) and each member's NIC uplink (bit/s; inf: unlimited)."""

    latency_s: np.ndarray
    rate_bps: np.ndarray
    nic_bps: np.ndarray

    @classmethod
    def of(cls, latency_s: np.ndarray, bandwidth_bps: np.ndarray, nic_bps: np.ndarray,
           devices: Sequence[int]) -> GatherLinks:
        """The members `devices` (indices into the N x N matrices and the N NICs, group order)."""
        index = np.asarray(list(devices), dtype=np.int64)
        nic = np.asarray(nic_bps, dtype=np.float64)[index]
        rate = np.minimum(np.asarray(bandwidth_bps, dtype=np.float64)[np.ix_(index, index)], nic[:, None])
        return cls(np.asarray(latency_s, dtype=np.float64)[np.ix_(index, index)], rate, nic)

    @classmethod
    def of_cluster(cls, cluster: Cluster, devices: Sequence[int]) -> GatherLinks:
        """The members `devices` of a geotrain.cluster.Cluster (its nic_gbps: inf when not given)."""
        nic = np.asarray(cluster.nic_gbps, dtype=np.float64) * 1e9
        return cls.of(cluster.latency_s, cluster.bandwidth_bps, nic, devices)

    @property
    def members(self) -> int:
        return int(self.latency_s.shape[0])

    def seconds(self, algorithm: str, payload_bytes: float) -> float:
        """Seconds to gather `payload_bytes` from every member with `algorithm` (module doc)."""
        n, bits = self.members, 8.0 * float(payload_bytes)
        if n < 2:
            return 0.0
        if algorithm == "ring":
            hop = [self.latency_s[i, (i + 1) % n] + bits / self.rate_bps[i, (i + 1) % n] for i in range(n)]
            return (n - 1) * float(max(hop))
        if algorithm == "direct":
            src, dst = np.nonzero(~np.eye(n, dtype=bool))
            serialise = np.maximum(bits / self.rate_bps[src, dst], (n - 1) * bits / self.nic_bps[src])
            return float((self.latency_s[src, dst] + serialise).max())
        raise ValueError(f"gather algorithm must be one of {', '.join(GATHER_ALGORITHMS)}, got {algorithm!r}")

    def algorithm(self, payload_bytes: float) -> str:
        """The faster algorithm for a payload of `payload_bytes` (ties: the ring)."""
        return "direct" if self.seconds("direct", payload_bytes) < self.seconds("ring", payload_bytes) else "ring"

    def best_seconds(self, payload_bytes: float) -> float:
        """Seconds of the algorithm `algorithm` chooses."""
        return self.seconds(self.algorithm(payload_bytes), payload_bytes)
