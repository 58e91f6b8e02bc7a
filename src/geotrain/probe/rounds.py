"""Round-robin pairings (the circle method): every pair of n processes meets exactly once, and no
process is in two pairs of the same round, so no NIC carries two measurements at once.

n even: n - 1 rounds of n/2 pairs; n odd: n rounds, one process sitting out each round. Process 0
stays put, the others rotate one seat per round.
"""

from __future__ import annotations


def circle_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of pairs (a, b), a < b, covering every unordered pair of range(n) exactly once."""
    if n < 2:
        return []
    seats: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    size = len(seats)
    rounds = []
    for _ in range(size - 1):
        pairs = []
        for k in range(size // 2):
            a, b = seats[k], seats[size - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return rounds


def partner_in_round(pairs: list[tuple[int, int]], rank: int) -> tuple[int, bool] | None:
    """(partner, rank is the lower of the two) in this round, or None if `rank` sits out."""
    for a, b in pairs:
        if rank == a:
            return b, True
        if rank == b:
            return a, False
    return None
