"""Link busy time: how long a link had a message in flight (the runtime's measured pipeline seconds).

The links themselves are emulated by the process-group backend (geotrain.emulate; docs/history/emulate.md).
"""

from __future__ import annotations

from collections.abc import Sequence


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals: how long a link had a message in flight."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total
