"""AdaptiveOuterSync with `periods` (the runtime's loop stops every rank at that sync): the last sync posts no step
times and `flush` gathers no step counts, so the run's end waits for no latency-bound collective but the exchange;
without `periods` (a user's loop) both still run. One replica, in process: a counting gather, an exchange that
leaves the one replica's outer gradient as the mean."""

from __future__ import annotations

import pytest
import torch

from geotrain.sync import SyncError
from geotrain.sync.adaptive import AdaptiveOuterSync
from geotrain.sync.base import ComputeTimer


class _Exchange:
    def exchange(self, step: int, timer: object) -> int:
        return 8  # one replica: its outer gradient is the mean

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _sync(periods: int | None) -> tuple[AdaptiveOuterSync, list[torch.Tensor], torch.nn.Parameter]:
    posted: list[torch.Tensor] = []

    def gather(mine: torch.Tensor):
        posted.append(mine.clone())
        return lambda: mine.reshape(1, -1)

    weight = torch.nn.Parameter(torch.ones(3))
    inner = torch.optim.SGD([weight], lr=0.1)
    sync = AdaptiveOuterSync([("w", weight)], inner, lambda shadows: _Exchange(), 2, 1.0, 0.0, gather, 0, 1,
                             periods=periods)
    return sync, posted, weight


def _run(sync: AdaptiveOuterSync, weight: torch.nn.Parameter, periods: int) -> None:
    timer = ComputeTimer()
    while sync.outer_step < periods:
        weight.grad = torch.ones(3)
        sync.step(0, timer)
    sync.flush(timer)


@pytest.mark.parametrize("periods", [1, 3])
def test_the_last_sync_posts_no_step_times_and_flush_gathers_no_counts(periods):
    sync, posted, weight = _sync(periods)
    _run(sync, weight, periods)
    assert len(posted) == periods - 1  # one step-time gather per sync that a period follows
    # the inner steps moved the weights by 0.1 per step; outer lr 1 and no momentum: the anchor is the weights
    assert torch.allclose(weight.detach(), torch.full((3,), 1.0 - 0.1 * 2 * periods))


def test_without_periods_every_sync_posts_its_times_and_flush_gathers_the_counts():
    sync, posted, weight = _sync(None)
    _run(sync, weight, 3)
    assert len(posted) == 3 + 1  # three syncs' step times, then flush's step counts
    assert posted[-1].tolist() == [0.0]
    assert torch.allclose(weight.detach(), torch.full((3,), 1.0 - 0.1 * 6))


def test_a_step_after_the_last_period_is_refused_at_flush():
    sync, _, weight = _sync(1)
    timer = ComputeTimer()
    for _ in range(3):  # two steps end period 1, the last; the third steps past it
        weight.grad = torch.ones(3)
        sync.step(0, timer)
    with pytest.raises(SyncError, match="after the run's last outer period"):
        sync.flush(timer)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_periods_must_be_a_positive_integer(bad):
    with pytest.raises(SyncError, match="periods must be an integer"):
        _sync(bad)
