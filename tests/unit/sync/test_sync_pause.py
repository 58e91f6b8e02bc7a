"""CollectivePause: a sync's own work is compute by the step timer's clock and scale, its collectives' time
is not (before it, a blocking exchange counted wall seconds whatever the timer's clock, and an overlapped
one's decoding at landing was not counted at all)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from geotrain.sync import DPGroup, StageExchange, SyncOptions, make_gradient_sync
from geotrain.sync.base import CollectivePause, ComputeTimer


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_work_is_counted_and_the_collective_left_out_by_the_timers_clock_and_scale():
    clock = ManualClock()
    timer = ComputeTimer(scale=2.0, clock=clock)
    pause = CollectivePause()
    with pause():  # no timing under way: nothing to stop
        clock.now += 7.0
    assert timer.seconds == 0.0
    with pause.timing(timer):
        clock.now += 1.0
        with pause():
            clock.now += 100.0
        clock.now += 0.5
    assert timer.seconds == 2.0 * 1.5
    with pause():  # the timing ended: nothing to stop or restart
        clock.now += 3.0
    assert timer.seconds == 3.0


class SlowTransport:
    """Runs each collective and moves the test clock by 100 s while it does (a long wait)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def collective(self, group, devices, nbytes, run, posted=False):
        self.clock.now += 100.0
        return run()


def _params() -> list[tuple[str, torch.nn.Parameter]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    model(torch.randn(3, 8)).square().sum().backward()
    return list(model.named_parameters())


def test_stage_exchange_leaves_blocking_and_posted_collectives_out_of_compute(world_of_one):
    clock = ManualClock()
    named = _params()
    exchange = StageExchange(named, "int8-block", True, SlowTransport(clock), dist.group.WORLD, [0])
    timer = ComputeTimer(clock=clock)
    assert exchange.exchange(0, timer) > 0
    assert timer.seconds == 0.0  # the clock moved only inside the collective
    land = exchange.start(1, timer)
    landing = ComputeTimer(clock=clock)
    assert land(landing) > 0
    assert clock.now == 200.0 and timer.seconds == 0.0 and landing.seconds == 0.0


def test_onebit_adam_leaves_its_collectives_out_of_compute(world_of_one):
    clock = ManualClock()
    named = _params()
    options = SyncOptions.of(codec="none", optimizer="onebit-adam", lr=1e-2, total_steps=4, onebit_warmup_steps=1)
    sync = make_gradient_sync(options, named, SlowTransport(clock), DPGroup(dist.group.WORLD, (0,), (0,), None), 0)
    timer = ComputeTimer(clock=clock)
    for step in range(3):  # the warm-up step (fp32 all-reduce) and two compressed ones
        sync.step(step, timer)
    assert clock.now >= 300.0 and timer.seconds == 0.0
