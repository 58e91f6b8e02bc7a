"""The slow-down fault (`--chaos slow:site=K,factor=F,at=T`) applied inside a worker.

Replica K's ranks compute F times slower from T seconds of training on (wall seconds since the rank's
first step). Under link emulation the rank's emulated clock and its compute timer count F x their
device's factor from then on (the emulated schedule, and so every peer waiting on this rank, sees the
slower compute; wall time does not, as with --emulate-gpu-speed). Without emulation the rank sleeps
(F - 1) x the compute it measured in the step, counted as compute. Several slow faults of one site
multiply once each is due.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from geotrain.emulate.install import Emulation
from geotrain.runtime.elastic.chaos import Fault, Slow, parse_chaos
from geotrain.sync.base import ComputeTimer


def site_slowdowns(chaos: str | None, replica: int) -> tuple[Slow, ...]:
    """The slow faults of a --chaos spec (None: none) that hit `replica`."""
    faults: Sequence[Fault] = parse_chaos(chaos) if chaos else ()
    return tuple(f for f in faults if isinstance(f, Slow) and f.site == replica)


def gpu_speed_faults(compute_scale: Sequence[float] | None, device: int, replica: int) -> tuple[Slow, ...]:
    """--emulate-gpu-speed where no emulated clock counts it (elastic asynchronous groups at --time-scale 0): device
    `device`'s slowness (`compute_scale`, RuntimeConfig.compute_scale(); None: off) as a slow fault of `replica` from
    the start, which SlowDown sleeps out; none for the fastest GPU."""
    factor = 1.0 if compute_scale is None else float(compute_scale[device])
    return (Slow(replica, factor),) if factor > 1.0 else ()


def slow_factor(faults: Sequence[Slow], elapsed_s: float) -> float:
    """The product of the factors of the faults due at `elapsed_s` seconds of training (1: none)."""
    factor = 1.0
    for fault in faults:
        if elapsed_s >= fault.at_s:
            factor *= fault.factor
    return factor


class SlowDown:
    """Applies a rank's slow faults step by step: `before_step()` at the start of a step, `after_compute()`
    after its forward and backward."""

    def __init__(self, faults: Sequence[Slow], timer: ComputeTimer, emulation: Emulation | None) -> None:
        self.faults = tuple(faults)
        self.timer = timer
        self.emulation = emulation
        self.base_scale = timer.scale
        self.factor = 1.0
        self._started: float | None = None

    def before_step(self) -> None:
        if not self.faults:
            return
        now = time.perf_counter()
        self._started = now if self._started is None else self._started
        factor = slow_factor(self.faults, now - self._started)
        if factor == self.factor:
            return
        if self.emulation is not None:
            clock = self.emulation.state().clock
            base = clock.compute_scale / self.factor
            clock.restart(clock.now())  # the time so far at the old rate, from now on the new one
            clock.compute_scale = base * factor
            self.timer.scale = self.base_scale * factor
        self.factor = factor

    def after_compute(self, compute_s: float) -> None:
        """Without emulation: sleep out the extra (factor - 1) x this step's compute so far, as compute."""
        if self.emulation is None and self.factor > 1.0 and compute_s > 0:
            with self.timer:
                time.sleep((self.factor - 1.0) * compute_s)
