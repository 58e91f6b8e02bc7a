"""Bandwidth demanded over time (geotrain.emulate.traffic): bytes carried while messages are on their links."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.emulate.traffic import MIN_WIRE_S, carried_bytes, peak_gbps, peak_profile


def test_one_message_reads_its_links_rate_inside_it_and_its_bytes_over_longer_windows():
    wire = np.array([[1.0, 1.1, 10e6]])  # 10 MB in 0.1 s: 0.8 Gbit/s on its link
    assert peak_profile(wire, windows_s=(0.01, 0.1, 1.0)) == pytest.approx({0.01: 0.8, 0.1: 0.8, 1.0: 0.8})
    # on a longer timeline a 1 s window holds all 10 MB
    assert peak_profile(wire, bounds=(0.0, 5.0), windows_s=(1.0,)) == pytest.approx({1.0: 0.08})


def test_messages_at_once_add_up_and_a_free_links_message_counts_at_once():
    wire = np.array([[0.0, 0.1, 1e6], [0.05, 0.15, 1e6], [0.5, 0.5, 2e6]])
    knots, carried = carried_bytes(wire, (0.0, 2.0))
    assert carried[-1] == pytest.approx(4e6)
    # overlap 0.05-0.1: both at 80 Mbit/s; the free-link message: 2 MB in MIN_WIRE_S
    assert peak_gbps(knots, carried, 0.05) == pytest.approx(2e6 * 8 / 1e9 / 0.05)
    assert peak_gbps(knots, carried, MIN_WIRE_S) == pytest.approx(2e6 * 8 / 1e9 / MIN_WIRE_S, rel=1e-6)


def test_no_traffic_demands_nothing():
    assert peak_profile(np.zeros((0, 3)), (0.0, 3.0)) == {w: 0.0 for w in (0.01, 0.03, 0.1, 0.3, 1.0)}
    assert peak_profile(np.zeros((0, 3))) == {w: 0.0 for w in (0.01, 0.03, 0.1, 0.3, 1.0)}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 4.0), st.floats(0.0, 1.0), st.floats(1.0, 1e7)), min_size=1, max_size=12),
       st.sampled_from([0.01, 0.1, 0.3, 1.0, 2.0]))
def test_peak_equals_a_brute_force_search_over_window_positions(messages, window):
    wire = np.array([[a, min(a + length, 5.0), b] for a, length, b in messages])
    knots, carried = carried_bytes(wire, (0.0, 5.0))
    assert carried[-1] == pytest.approx(wire[:, 2].sum(), rel=1e-6)
    lo, hi = wire[:, 0], np.maximum(wire[:, 1], wire[:, 0] + MIN_WIRE_S)

    def held(x: float) -> float:  # bytes inside [x, x + window]: each message's overlap share
        overlap = np.clip(np.minimum(hi, x + window) - np.maximum(lo, x), 0.0, None)
        return float(np.sum(wire[:, 2] * overlap / (hi - lo)))

    starts = np.clip(np.concatenate([lo, hi, lo - window, hi - window, [0.0]]), 0.0, 5.0 - window)
    best = max(held(x) for x in starts)
    assert peak_gbps(knots, carried, window) == pytest.approx(best * 8 / 1e9 / window, rel=1e-6)
    # and no window anywhere holds more
    assert all(held(x) <= best * (1 + 1e-9) + 1e-6 for x in np.linspace(0.0, 5.0 - window, 101))
