"""The traffic of each collective, as rounds of messages among n group members (see schedule.py).

These are the algorithms a CPU/gloo job runs (gloo's ring all-reduce and ring all-gather) or the textbook
choice where the wrapper composes an operation (member indices are group ranks, root given as one):
- all-reduce, ring: 2 (n - 1) rounds; in each, member i sends b / n bytes to i + 1 (reduce-scatter
  phase, then all-gather phase). Time = 2 (n - 1) x the slowest ring link's latency + 8 (b / n) / rate.
- reduce-scatter, ring: the first n - 1 of those rounds (b = the whole input per member).
- all-gather, ring: n - 1 rounds, member i sends one piece (b_piece = each member's input) to i + 1.
- broadcast, binomial tree: ceil(log2 n) rounds; in round k, members 0..2^k - 1 (relative to the root)
  send the whole buffer to member + 2^k.   reduce: the same tree, reversed.
- gather: one round, every member sends its piece to the root; scatter: one round from the root
  (its NIC shared by the n - 1 pieces).   all-to-all: one round, every member sends each peer its part.
- barrier, dissemination: ceil(log2 n) rounds of empty messages i -> i + 2^k.
"""

from __future__ import annotations

from collections.abc import Sequence

from geotrain.emulate.schedule import Message


def _log2_rounds(n: int) -> int:
    return max(0, (n - 1).bit_length())


def ring_allreduce(n: int, nbytes: float) -> list[list[Message]]:
    ring = [(i, (i + 1) % n, nbytes / n) for i in range(n)]
    return [list(ring) for _ in range(2 * (n - 1))] if n > 1 else []


def ring_reduce_scatter(n: int, nbytes: float) -> list[list[Message]]:
    """`nbytes`: the whole input of one member (each ends with nbytes / n)."""
    return ring_allreduce(n, nbytes)[: n - 1] if n > 1 else []


def ring_allgather(n: int, piece_bytes: float) -> list[list[Message]]:
    ring = [(i, (i + 1) % n, piece_bytes) for i in range(n)]
    return [list(ring) for _ in range(n - 1)] if n > 1 else []


def binomial_broadcast(n: int, root: int, nbytes: float) -> list[list[Message]]:
    rounds = []
    for k in range(_log2_rounds(n)):
        step = 1 << k
        rounds.append([((v + root) % n, (v + step + root) % n, nbytes) for v in range(step) if v + step < n])
    return rounds


def binomial_reduce(n: int, root: int, nbytes: float) -> list[list[Message]]:
    return [[(dst, src, b) for src, dst, b in messages] for messages in reversed(binomial_broadcast(n, root, nbytes))]


def gather(n: int, root: int, piece_bytes: float) -> list[list[Message]]:
    return [[(i, root, piece_bytes) for i in range(n) if i != root]] if n > 1 else []


def scatter(n: int, root: int, piece_bytes: float) -> list[list[Message]]:
    return [[(root, i, piece_bytes) for i in range(n) if i != root]] if n > 1 else []


def all_to_all(send_bytes: Sequence[Sequence[float]]) -> list[list[Message]]:
    """`send_bytes[i][j]`: bytes member i sends member j."""
    n = len(send_bytes)
    messages = [(i, j, float(send_bytes[i][j])) for i in range(n) for j in range(n) if i != j]
    return [messages] if messages else []


def dissemination_barrier(n: int) -> list[list[Message]]:
    return [[(i, (i + (1 << k)) % n, 0.0) for i in range(n)] for k in range(_log2_rounds(n))]
