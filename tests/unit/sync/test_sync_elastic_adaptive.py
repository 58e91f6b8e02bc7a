"""The split of adaptive local steps over an elastic quorum (geotrain.sync.elastic_adaptive): the quorum's n x H
steps by speed, absent groups at 0, a never-measured group's speed from its prior scaled to the measured ones,
and the data position of each inner step of a period (each slice of the equal schedule's steps once)."""

from __future__ import annotations

import math

import pytest

from geotrain.sync.base import SyncError
from geotrain.sync.elastic_adaptive import estimated_step_s, period_position, quorum_split


def test_the_quorum_shares_its_n_x_h_steps_by_speed_and_absent_groups_take_none():
    assert quorum_split([1.0, 4.8], [0, 1], 3) == [5, 1]  # an A100 and a T4 (4.8x): 6 x 4.8 / 5.8 = 4.97
    assert quorum_split([1.0, 4.8, 2.0], [0, 2], 3) == [4, 0, 2]  # group 1 lost: 2 x 3 steps by 1 : 0.5
    assert quorum_split([1.0, math.nan], [0, 1], 3) == [3, 3]  # a speed unknown: the equal split
    with pytest.raises(SyncError, match="no replica group"):
        quorum_split([1.0], [], 3)


def test_a_never_measured_group_gets_its_prior_scaled_to_the_measured_ones():
    # group 0 measured 0.2 s where its prior says 1: group 1's prior of 4.8 becomes 0.96 s
    assert estimated_step_s([0.2, math.nan], [1.0, 4.8]) == pytest.approx([0.2, 0.96])
    assert estimated_step_s([math.nan, math.nan], [1.0, 4.8]) == [1.0, 4.8]  # none measured: the priors alike
    assert estimated_step_s([0.5, 0.7], [1.0, 4.8]) == [0.5, 0.7]  # measured speeds win
    assert math.isnan(estimated_step_s([0.2, math.nan], None)[1])


def test_a_period_s_inner_steps_train_each_slice_of_its_equal_steps_once():
    split, every, period = [5, 1], 3, 7
    positions = [period_position(period, sum(split[:g]) + k, every) for g in range(2) for k in range(split[g])]
    assert sorted(positions) == [(t, s) for t in range(21, 24) for s in range(2)]
    assert [period_position(period, k, every) for k in range(3)] == [(21, 0), (22, 0), (23, 0)]  # equal: own slice
