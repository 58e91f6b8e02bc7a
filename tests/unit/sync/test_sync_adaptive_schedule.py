"""geotrain.sync.adaptive.adaptive_local_steps: H_r in proportion to speed, integers >= 1 summing to R x H."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geotrain.sync import SyncError
from geotrain.sync.adaptive import adaptive_local_steps, check_adaptive_settings


def test_equal_speeds_give_every_replica_h_steps():
    assert adaptive_local_steps([0.2, 0.2, 0.2, 0.2], 5) == [5, 5, 5, 5]


def test_a_four_times_slower_replica_takes_a_quarter_of_the_steps():
    # speeds 4 : 4 : 2 : 1 over 11 parts of 40 steps: 14.55, 14.55, 7.27, 3.64 -> largest remainders
    assert adaptive_local_steps([1.0, 1.0, 2.0, 4.0], 10) == [15, 14, 7, 4]
    assert adaptive_local_steps([1.0, 2.0], 4) == [5, 3]


def test_an_unmeasured_or_broken_time_keeps_the_equal_schedule():
    assert adaptive_local_steps([0.1, 0.0], 4) == [4, 4]
    assert adaptive_local_steps([0.1, float("nan")], 4) == [4, 4]


def test_a_very_slow_replica_still_takes_one_step():
    assert adaptive_local_steps([1.0, 1e6], 3) == [5, 1]


@given(st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=1, max_size=8), st.integers(1, 50))
def test_steps_are_at_least_one_and_sum_to_r_times_h(seconds, h):
    steps = adaptive_local_steps(seconds, h)
    assert sum(steps) == len(seconds) * h
    assert min(steps) >= 1
    fastest, slowest = seconds.index(min(seconds)), seconds.index(max(seconds))
    assert steps[fastest] >= steps[slowest]


def test_adaptive_with_a_streaming_setting_is_refused_in_one_line():
    with pytest.raises(SyncError, match=r"^local_steps adaptive runs the flat outer sync of one fragment only; not "
                                        r"with fragments > 1 \(") as error:
        check_adaptive_settings("adaptive", fragments=2)
    assert "\n" not in str(error.value)
    with pytest.raises(SyncError, match="must be one of equal, adaptive, got 'fast'"):
        check_adaptive_settings("fast")
    check_adaptive_settings("equal", fragments=4)
