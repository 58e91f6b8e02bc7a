"""Eager landing of Streaming DiLoCo (geotrain.sync.streaming, landing="eager"), in-process: a loopback
exchange stands in for the other replicas (the mean = this replica's outer gradient + a known offset),
the inner optimizer is SGD on weight-independent gradients, so every parameter is known in closed form."""

from __future__ import annotations

import pytest
import torch

from geotrain.sync.base import ComputeTimer
from geotrain.sync import SyncError, SyncOptions
from geotrain.sync.streaming import StreamingOuterSync

INNER_LR = 0.1
OFFSET = torch.tensor([0.5, -0.25, 1.0, 0.0])
"""Other replicas' pull: the group mean of the outer gradient is this replica's + OFFSET."""


class LoopbackExchange:
    """A DPExchange whose 'mean' is the local outer gradient + OFFSET, blocking or posted (start)."""

    def __init__(self, named_shadows: list[tuple[str, torch.nn.Parameter]]) -> None:
        self.shadows = [s for _, s in named_shadows]

    def _means(self) -> list[torch.Tensor]:
        return [s.grad + OFFSET for s in self.shadows]

    def exchange(self, step, timer) -> int:
        for s, mean in zip(self.shadows, self._means()):
            s.grad.copy_(mean)
        return 16

    def start(self, step, timer):
        means = self._means()  # what the collective carries: the values at the start

        def land(landing_timer=timer) -> int:
            for s, mean in zip(self.shadows, means):
                s.grad.copy_(mean)
            return 16

        return land

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        return None



def _run(delay: int, landing: str, steps: int, outer_lr: float = 1.0, outer_momentum: float = 0.0,
         sync_every: int = 3, warmup: int = 0) -> tuple[torch.nn.Parameter, StreamingOuterSync, list[torch.Tensor]]:
    """Train one parameter of 4 values with gradient (step + 1) x ones; returns it, the sync and the
    parameter after every step."""
    param = torch.nn.Parameter(torch.zeros(4))
    inner = torch.optim.SGD([param], lr=INNER_LR)
    sync = StreamingOuterSync([("w", param)], inner, LoopbackExchange, sync_every, 1, delay, 0.0, outer_lr,
                              outer_momentum, total_steps=None, landing=landing, warmup=warmup)
    after = []
    for step in range(steps):
        param.grad = torch.full((4,), float(step + 1))
        inner.step()
        sync.after_inner_step(step, ComputeTimer())
        after.append(param.detach().clone())
    return param, sync, after


def test_eager_landing_applies_the_local_proxy_then_only_the_correction():
    # H=3, tau=1, averaging: the sync starts after step 2, the mean lands after step 3
    _, sync, after = _run(delay=1, landing="eager", steps=4)
    local_at_start = -INNER_LR * (1 + 2 + 3) * torch.ones(4)
    # the proxy of averaging is the local fragment itself: nothing moves at the start
    assert torch.allclose(after[2], local_at_start, atol=1e-7)
    assert sync.in_flight == 0
    anchor = sync.fragments[0].outer.anchor[0].detach()
    # anchor = 0 - mean outer gradient = the replicas' mean = local - OFFSET
    assert torch.allclose(anchor, local_at_start - OFFSET, atol=1e-6)
    # local = the mean at the start + the progress of the overlapped step (step 3's), none of it dropped
    assert torch.allclose(after[3], local_at_start - OFFSET - INNER_LR * 4, atol=1e-6)


@pytest.mark.parametrize("outer_lr,outer_momentum", [(1.0, 0.0), (0.7, 0.9)])
def test_eager_with_weight_independent_gradients_lands_on_the_blocking_trajectory(outer_lr, outer_momentum):
    """The overlapped steps' progress does not depend on where it is taken here, so eager landing (tau=2)
    must give, from the landing on, exactly blocking DiLoCo's parameters; the mix rule (alpha 0) does not."""
    _, blocking_sync, blocking = _run(0, "mix", 11, outer_lr, outer_momentum, sync_every=4)
    _, eager_sync, eager = _run(2, "eager", 11, outer_lr, outer_momentum, sync_every=4)
    _, _, mixed = _run(2, "mix", 11, outer_lr, outer_momentum, sync_every=4)
    # syncs start after steps 3 and 7 and land after 5 and 9; from 5 to 6 and from 9 on, no sync in flight
    for step in (5, 6, 9, 10):
        assert torch.allclose(eager[step], blocking[step], atol=1e-5), step
    assert not torch.allclose(mixed[9], blocking[9], atol=1e-3)
    anchors = [s.fragments[0].outer.anchor[0].detach() for s in (blocking_sync, eager_sync)]
    assert torch.allclose(anchors[0], anchors[1], atol=1e-5)


def test_eager_without_delay_is_blocking_bit_for_bit():
    for momentum in (0.0, 0.9):
        _, _, blocking = _run(0, "mix", 8, 0.7, momentum)
        _, _, eager = _run(0, "eager", 8, 0.7, momentum)
        assert all(torch.equal(a, b) for a, b in zip(blocking, eager))


def test_syncs_started_in_the_warmup_block_and_the_later_ones_overlap():
    # H=3, tau=1, mix 0.5, warm-up 4 steps: the sync after step 2 blocks (as tau 0), the one after step 5 flies
    _, _, blocking = _run(0, "mix", 7)
    _, sync, warm = _run(1, "mix", 7, warmup=4)
    _, _, late = _run(1, "mix", 7)
    assert all(torch.equal(a, b) for a, b in zip(blocking[:5], warm[:5]))
    assert not torch.equal(late[2], warm[2])  # without the warm-up the first sync is in flight after step 2
    _, sync, _ = _run(1, "mix", 6, warmup=4)
    assert sync.in_flight == 1  # started after step 5, lands after step 6


def test_eager_refuses_a_mix_and_unknown_landings():
    param = torch.nn.Parameter(torch.zeros(4))
    inner = torch.optim.SGD([param], lr=INNER_LR)
    with pytest.raises(SyncError, match=r"mix 0.5 is the mix landing's alpha"):
        StreamingOuterSync([("w", param)], inner, LoopbackExchange, 3, 1, 1, 0.5, landing="eager")
    with pytest.raises(SyncError, match=r"landing must be one of mix, eager, got 'lazy'"):
        StreamingOuterSync([("w", param)], inner, LoopbackExchange, 3, 1, 1, landing="lazy")
    with pytest.raises(SyncError, match=r"StreamingOptions: mix 0.5 is the mix landing's alpha"):
        SyncOptions.of(codec="int8-block", optimizer="adamw", lr=0.01, total_steps=9, sync_every=3, delay=1, mix=0.5,
                       landing="eager")
    with pytest.raises(SyncError, match=r"warmup \(steps whose syncs block\) must be an integer >= 0, got -1"):
        StreamingOuterSync([("w", param)], inner, LoopbackExchange, 3, 1, 1, warmup=-1)
    with pytest.raises(SyncError, match=r"landing 'eager' and warmup 0 are Streaming DiLoCo's: they need sync_every"):
        SyncOptions.of(codec="none", optimizer="adamw", lr=0.01, total_steps=9, landing="eager")
