"""One rank's emulated clock: compute runs at real speed, communication costs what the links say.

The clock reads `base + (wall now - wall base)`: between operations it advances with the real time the
program computes. An operation is finished with `hold()` before blocking on the real (fast, localhost)
exchange and `finish(held, t)` after it, where t is the emulated end the schedule gives:
- the emulated clock becomes max(held clock, t): time blocked in the real exchange does not count
  (waiting for a peer is decided by the emulated schedule, exchanged with the data), and sleep
  overshoot does not enter emulated times;
- the rank sleeps `time_scale` x (t - held clock) wall seconds, less the wall time it was already
  blocked: a receiver that waited in real time for a sender who was itself sleeping out link time does
  not sleep that time again, so wall time tracks emulated time (x time_scale);
- wall time spent beyond what the links required (sleep overshoot, real overheads on a loaded machine)
  is kept as a debt and taken off the next sleeps, so it does not pile up along a pipeline.
`waited_s` sums the jumps (max(0, t - held clock)): over any interval, the clock's advance less the
growth of `waited_s` is what the rank's own work cost (compute and host work; the runtime's `busy_s`).
`compute_scale` k emulates a device k times slower than this machine: between operations the clock
advances k x the real time (k = 1: real speed). With k != 1 wall time no longer tracks emulated time
during compute; emulated times stay exact, since waiting is decided by the emulated schedule.

When k applies (the start-up rule): only to the loop. Until the loop starts the clock counts compute at this
machine's speed (k = 1): the script's set-up (building the model, loading data, anything before its first
collective) is host work, which a slow GPU does not slow. The loop starts at the end of the rank's first
operation (a collective, barrier, send or receive), or at `start_loop()` if that comes first (a loop whose
first collective comes late: local SGD). Compute inside a `host_work()` block counts at k = 1 too, and an
operation inside it does not start the loop (set-up that itself runs collectives: `geotrain train`'s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Held = tuple[float, float]  # (emulated clock, wall clock) when the rank started blocking


class RankClock:
    """Emulated seconds since this rank's process group was initialised (the start-up rule: module doc)."""

    def __init__(self, time_scale: float, wall: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep, compute_scale: float = 1.0) -> None:
        if not compute_scale > 0 or compute_scale == float("inf"):
            raise ValueError(f"compute_scale must be a finite number > 0, got {compute_scale!r}")
        self.time_scale = time_scale
        self.compute_scale = compute_scale  # the device's factor: the loop's compute (module doc)
        self.loop_started = False
        self._host_depth = 0  # host_work() blocks entered and not left
        self._wall = wall
        self._sleep = sleep
        self._base_s = 0.0
        self._wall_base = wall()
        self.slept_s = 0.0  # wall seconds slept for emulated link time
        self.waited_s = 0.0  # emulated seconds the clock jumped ahead to operations' ends: time blocked on links
        self._debt_s = 0.0  # wall seconds this rank is behind its emulated clock (x time_scale)

    @property
    def rate(self) -> float:
        """Emulated seconds per measured second of compute now: compute_scale in the loop, else 1."""
        return self.compute_scale if self.loop_started and not self._host_depth else 1.0

    def now(self) -> float:
        return self._base_s + self.rate * (self._wall() - self._wall_base)

    def restart(self, t_s: float = 0.0) -> None:
        """Set the clock to `t_s` now."""
        self._base_s, self._wall_base = t_s, self._wall()

    def start_loop(self) -> None:
        """From now on compute counts at compute_scale (outside host_work); no-op once the loop has started."""
        if not self.loop_started:
            self.restart(self.now())
            self.loop_started = True

    @contextmanager
    def host_work(self) -> Iterator[None]:
        """Count the compute inside at this machine's speed; an operation inside does not start the loop."""
        self.restart(self.now())
        self._host_depth += 1
        try:
            yield
        finally:
            self.restart(self.now())
            self._host_depth -= 1

    def hold(self) -> Held:
        """Call before blocking on the real exchange; pass the result to `finish`."""
        wall = self._wall()
        return self._base_s + self.rate * (wall - self._wall_base), wall

    def finish(self, held: Held, t_s: float) -> None:
        """End an operation that the links finish at emulated `t_s` (see the module docstring)."""
        emulated, wall_then = held
        self.waited_s += max(0.0, t_s - emulated)
        blocked = self._wall() - wall_then
        need = max(0.0, t_s - emulated) * self.time_scale
        have = blocked + self._debt_s
        if self.time_scale > 0 and need > have:
            before = self._wall()
            self._sleep(need - have)
            slept = self._wall() - before
            self.slept_s += slept
            self._debt_s = max(0.0, slept - (need - have))
        else:
            self._debt_s = have - need if self.time_scale > 0 else 0.0
        self.restart(max(t_s, emulated))
        if not self._host_depth:
            self.loop_started = True  # the first operation ends the start-up (module doc)

    def wait_until(self, t_s: float) -> None:
        """Block (scaled real sleep) until the emulated clock reads `t_s`; no-op if it already does."""
        self.finish(self.hold(), t_s)
