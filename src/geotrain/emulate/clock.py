"""One rank's emulated clock: compute runs at real speed, communication costs what the links say.

The clock reads `base + (wall now - wall base)`: between operations it advances with the real time the
program computes. While a rank is blocked in the real (fast, localhost) exchange the clock is frozen
(`hold`/`release`): waiting for a slower peer is not compute, and the emulated start of a collective is
the latest member's clock, exchanged with the data. `wait_until(t)` then sleeps `time_scale` x the
emulated wait and sets the clock to exactly t, so emulated times do not depend on sleep overshoot.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class RankClock:
    """Emulated seconds since this rank created its emulated process group."""

    def __init__(self, time_scale: float, wall: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.time_scale = time_scale
        self._wall = wall
        self._sleep = sleep
        self._base_s = 0.0
        self._wall_base = wall()
        self.slept_s = 0.0  # wall seconds slept for emulated link time

    def now(self) -> float:
        return self._base_s + (self._wall() - self._wall_base)

    def hold(self) -> float:
        """The clock now, before blocking on the real exchange; pass it to `release` afterwards."""
        return self.now()

    def release(self, held_s: float) -> None:
        """Resume counting from `held_s`: the real blocked time does not count."""
        self._base_s, self._wall_base = held_s, self._wall()

    def wait_until(self, t_s: float) -> None:
        """Block (scaled real sleep) until the emulated clock reads `t_s`; no-op if it already does."""
        now = self.now()
        if t_s <= now:
            return
        if self.time_scale > 0:
            self._sleep((t_s - now) * self.time_scale)
            self.slept_s += (t_s - now) * self.time_scale
        self._base_s, self._wall_base = t_s, self._wall()
