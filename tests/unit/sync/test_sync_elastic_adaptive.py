"""The split of adaptive local steps over an elastic quorum (geotrain.sync.elastic_adaptive): the quorum's n x H
steps by speed, absent groups at 0, a never-measured group's speed from its prior scaled to the measured ones,
the data position of each inner step of a period (each slice of the equal schedule's steps once), and a non-elastic
adaptive run's state at an outer sync as a resumed elastic group's (its index, table and split; mid-period: refused);
a delayed sync (--sync-delay, with --sync-moments) lands d steps into the next period, and a checkpoint taken with it
in flight (an elastic one, or a non-elastic adaptive run's) resumes to the same parameters and moments."""

from __future__ import annotations

import copy
import math

import pytest

import torch

from geotrain.optim.outer import OuterStep
from geotrain.sync.adaptive import AdaptiveOuterSync
from geotrain.sync.base import ComputeTimer, SyncError
from geotrain.sync.elastic_adaptive import ElasticAdaptiveSync, estimated_step_s, period_position, quorum_split


def test_the_quorum_shares_the_period_s_r_x_h_steps_by_speed_and_absent_groups_take_none():
    assert quorum_split([1.0, 4.8], [0, 1], 3) == [5, 1]  # an A100 and a T4 (4.8x): 6 x 4.8 / 5.8 = 4.97
    assert quorum_split([1.0, 4.8, 2.0], [0, 2], 3) == [6, 0, 3]  # group 1 lost: all 3 x 3 steps by 1 : 0.5
    assert quorum_split([1.0, math.nan], [0, 1], 3) == [3, 3]  # a speed unknown: the equal split
    assert quorum_split([1.0, 4.8, math.nan], [0, 2], 3) == [5, 0, 4]  # one unknown, one lost: 9 steps equally
    assert quorum_split([4.8, 1.0], [0], 3) == [6, 0]  # the T4 alone takes the A100's steps too
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
    alone = [period_position(period, k, every) for k in range(quorum_split([4.8, 1.0], [0], every)[0])]
    assert sorted(alone) == [(t, s) for t in range(21, 24) for s in range(2)]  # group 1 lost: none of its slices


def test_a_period_trained_by_part_of_the_quorum_moves_the_anchor_by_sum_over_r():
    param = torch.nn.Parameter(torch.zeros(3))
    sync = ElasticAdaptiveSync([param], torch.optim.SGD([param], lr=1.0), OuterStep([param], 3, 1.0, 0.0),
                               _Quorum(), 0, 2, 3, 10)
    sync.local_steps = quorum_split([1.0, 1.0], [0], 3)  # group 1 lost at the last sync: group 0 takes all 6 steps
    for _ in range(sync.my_local_steps):
        param.grad = -torch.ones(3)
        sync.step(0, ComputeTimer())
    assert sync.due and torch.equal(param.detach(), torch.full((3,), 6.0))
    sync.outer_sync(ComputeTimer())  # the quorum: group 0 alone (group 1 absent: 0 in the side sum)
    assert torch.equal(sync.outer.anchor[0].detach(), torch.full((3,), 3.0))  # 6 steps / R = 2: H's scale
    assert sync.local_steps == [6, 0]


class _Exchange:
    """Replica 0 of 2 in process: its outer gradient stays as the mean; no state of its own."""

    def exchange(self, step: int, timer: object, *args: object, **kwargs: object) -> int:
        return 8

    def over(self, params: object) -> _Exchange:
        return self

    def start(self, step: int, timer: object, *args: object, **kwargs: object) -> object:
        return lambda timer: 8

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _adaptive(steps: int, delay: int = 0) -> tuple[AdaptiveOuterSync, torch.nn.Parameter]:
    """Replica 0 (1 s per step) of 2 (the other's gathered 4.8 s: a T4 beside an A100), H 3, after `steps`."""
    weight = torch.nn.Parameter(torch.ones(3))
    sync = AdaptiveOuterSync([("w", weight)], torch.optim.SGD([weight], lr=0.1), lambda shadows: _Exchange(), 3,
                             1.0, 0.0, lambda mine: lambda: torch.stack([mine, 4.8 * mine]), 0, 2,
                             step_time=lambda: 1.0, delay=delay)
    for _ in range(steps):
        weight.grad = torch.ones(3)
        sync.step(0, ComputeTimer())
    return sync, weight


def test_a_non_elastic_adaptive_state_at_an_outer_sync_resumes_an_elastic_group_with_its_table_and_split():
    source, weight = _adaptive(3 + 3 + 5)  # periods of 3, 3 (the times of the first posted), then 5: at a sync
    assert source.period_steps == 0 and source.local_steps == [5, 1]
    fresh = torch.nn.Parameter(torch.zeros(3))  # the resumed group's own (its weights load beside: the module's)
    elastic = ElasticAdaptiveSync([fresh], torch.optim.SGD([fresh], lr=0.1), OuterStep([fresh], 3, 1.0, 0.0),
                                  _Exchange(), 0, 2, 3, 10)
    elastic.load_state_dict(source.state_dict())
    assert elastic.outer_step == 3 and elastic.local_steps == [5, 1] and not elastic.at_sync
    assert elastic.step_s == [1.0, 4.8]  # the last period's measured seconds (posted, not yet shared by)
    assert torch.equal(elastic.outer.anchor[0].detach(), weight.detach())  # at a sync: the anchor is the weights
    with pytest.raises(ValueError, match="2 steps into a period: elastic adaptive runs resume at outer syncs"):
        elastic.load_state_dict(_adaptive(3 + 2)[0].state_dict())


class _Quorum:
    """A quorum of one group in process (its mean is its own outer gradient) with ManagerExchange's side sum; its
    fragment exchanges (`over`) take the moments' parts and leave every gradient as it is."""

    side_sum: torch.Tensor | None = None

    def over(self, params: object, extra: object = ()) -> _Quorum:
        return self

    def exchange(self, step: int, timer: object, parts: int | None = None, side: torch.Tensor | None = None) -> int:
        self.side_sum = side
        return 8

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _delayed(weight: torch.Tensor) -> ElasticAdaptiveSync:
    """Group 0 of 1, H 3, --sync-delay 1 with --sync-moments, around a copy of `weight` (AdamW, outer lr 0.5)."""
    param = torch.nn.Parameter(weight.clone())
    adamw = torch.optim.AdamW([param], lr=0.1)
    return ElasticAdaptiveSync([param], adamw, OuterStep([param], 3, 0.5, 0.0), _Quorum(), 0, 1, 3, 10, delay=1,
                               moment_parts=lambda moments: [])


def _inner_step(sync: ElasticAdaptiveSync, k: int) -> None:
    sync.params[0].grad = torch.arange(3.0) + k
    sync.step(k, ComputeTimer())


def test_a_delayed_elastic_sync_lands_d_steps_later_and_a_checkpoint_with_it_in_flight_resumes_the_same_numbers():
    sync = _delayed(torch.ones(3))
    for k in range(3):
        _inner_step(sync, k)
    assert sync.due
    sync.outer_sync(ComputeTimer())
    anchor = sync.outer.anchor[0].detach().clone()  # the anchor steps when the mean lands
    assert sync.flight is not None and sync.flight.lands_after == 1 and sync.history[-1]["moments"]
    assert not torch.equal(sync.params[0].detach(), anchor)  # committed, not landed: the local progress goes on
    state = copy.deepcopy(sync.state_dict())  # as a checkpoint's: the optimizer's tensors are not shared
    assert "in_flight" in state and "moments" in state
    resumed = _delayed(sync.params[0].detach())  # a checkpoint's model and sync state
    resumed.load_state_dict(state)
    for run in (sync, resumed):
        _inner_step(run, 3)  # d = 1 step into the next period: the anchor steps, the mean lands (mix 0: on it)
        assert run.flight is None and not torch.equal(run.outer.anchor[0].detach(), anchor)
        assert torch.equal(run.params[0].detach(), run.outer.anchor[0].detach())
        for k in range(4, 6):
            _inner_step(run, k)
        run.outer_sync(ComputeTimer())
        run.flush(ComputeTimer())
    assert torch.equal(sync.params[0].detach(), resumed.params[0].detach())
    assert torch.equal(sync.params[0].detach(), sync.outer.anchor[0].detach())  # the end: every group on the anchor
    assert torch.equal(sync.optimizer.state_dict()["state"][0]["exp_avg"],
                       resumed.optimizer.state_dict()["state"][0]["exp_avg"])


def test_a_non_elastic_adaptive_checkpoint_with_a_sync_in_flight_lands_it_in_the_elastic_group_at_the_same_step():
    source, weight = _adaptive(3 + 3 + 5, delay=1)  # the sync after the third period in flight: lands after 2 of 5
    source.settle(ComputeTimer())
    fresh = torch.nn.Parameter(weight.detach().clone())  # the checkpoint's weights
    elastic = ElasticAdaptiveSync([fresh], torch.optim.SGD([fresh], lr=0.1), OuterStep([fresh], 3, 1.0, 0.0),
                                  _Exchange(), 0, 2, 3, 10, delay=1)
    elastic.load_state_dict(copy.deepcopy(source.state_dict()))
    assert elastic.flight is not None and elastic.flight.lands_after == 2 and elastic.local_steps == [5, 1]
    for run, param in ((source, weight), (elastic, fresh)):
        for _ in range(2):
            param.grad = torch.ones(3)
            run.step(0, ComputeTimer())
    assert elastic.flight is None and source.in_flight == 0
    assert torch.equal(fresh.detach(), weight.detach()) and torch.equal(elastic.outer.anchor[0], source.outer.anchor[0])
