"""Bandwidth demanded over time: the bytes messages carry while they are on their links, and the peak
rate over a window.

A message of b bytes on its link from t0 to t1 (its start to its last byte leaving: `Transfer.wire_end_s`)
carries b / (t1 - t0) bytes per second in between; a message with t1 = t0 (a free link) counts as
MIN_WIRE_S long. The bytes carried up to time t are then piecewise linear in t, so the busiest window of
any length has an end at a message's start or end: `peak_gbps` searches those.

- `carried_bytes(wire)`: (knots, bytes carried by each knot) from rows [start_s, end_s, bytes].
- `peak_gbps(knots, carried, window_s)`: the highest mean rate (Gbit/s) over any window of `window_s`.
- `peak_profile(wire)`: {window: peak} for PEAK_WINDOWS_S. A window shorter than one burst reads the
  links' own rate; one spanning several bursts, their mean rate. `profile_json`: as reports write it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PEAK_WINDOWS_S: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0)
"""The profile's windows (s); 1 s is bench wan's `peak_inter_region_gbps`."""
MIN_WIRE_S = 1e-6
"""A message that takes no time on its link counts as this long (s)."""


def carried_bytes(wire: np.ndarray, bounds: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(knots, carried): the bytes the messages `wire` ((n, 3) rows [start_s, end_s, bytes]) have carried by
    each knot (s), linear between knots. `bounds`: (first, last) times to include as knots (a timeline
    longer than its traffic)."""
    wire = np.asarray(wire, dtype=float).reshape(-1, 3)
    wire = wire[wire[:, 2] > 0]
    extra = np.asarray(bounds if bounds is not None else [], dtype=float)
    if not len(wire):
        knots = np.unique(extra) if len(extra) else np.zeros(1)
        return knots, np.zeros(len(knots))
    start = wire[:, 0]
    end = np.maximum(wire[:, 1], start + MIN_WIRE_S)
    rate = wire[:, 2] / (end - start)
    knots, where = np.unique(np.concatenate([start, end, extra]), return_inverse=True)
    delta = np.zeros(len(knots))
    np.add.at(delta, where, np.concatenate([rate, -rate, np.zeros(len(extra))]))
    carried = np.concatenate([[0.0], np.cumsum(np.cumsum(delta)[:-1] * np.diff(knots))])
    return knots, carried


def peak_gbps(knots: np.ndarray, carried: np.ndarray, window_s: float) -> float:
    """Highest mean rate (Gbit/s) over any `window_s` inside [knots[0], knots[-1]] (all of it if shorter)."""
    t0, t1 = float(knots[0]), float(knots[-1])
    if t1 <= t0:
        return 0.0
    window = min(window_s, t1 - t0)
    starts = np.clip(np.concatenate([knots, knots - window]), t0, t1 - window)
    held = np.interp(starts + window, knots, carried) - np.interp(starts, knots, carried)
    return float(held.max() * 8 / 1e9 / window)


def peak_profile(wire: np.ndarray, bounds: tuple[float, float] | None = None,
                 windows_s: Sequence[float] = PEAK_WINDOWS_S) -> dict[float, float]:
    """{window (s): peak_gbps at that window} of the messages `wire` (carried_bytes)."""
    knots, carried = carried_bytes(wire, bounds)
    return {float(w): peak_gbps(knots, carried, w) for w in windows_s}


def profile_json(profile: dict[float, float]) -> dict[str, float]:
    """A peak profile keyed as the JSON reports key it: the window in seconds, "0.01" ... "1"."""
    return {f"{w:g}": gbps for w, gbps in profile.items()}
