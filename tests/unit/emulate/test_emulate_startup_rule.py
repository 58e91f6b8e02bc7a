"""The start-up rule of a rank's emulated clock (emulate/clock.py): compute counts at the device's factor from the
loop's start only (the end of the rank's first operation, or start_loop()); set-up, and host_work() blocks, count at
this machine's speed."""

import pytest

from geotrain.emulate.clock import RankClock


def _clock(k: float) -> tuple[RankClock, list[float]]:
    wall = [0.0]
    return RankClock(0.0, wall=lambda: wall[0], sleep=lambda s: None, compute_scale=k), wall


def test_set_up_before_the_first_operation_counts_at_this_machines_speed_and_the_loop_at_the_devices():
    clock, wall = _clock(4.8)  # a T4 next to an A100
    wall[0] = 1.0  # one second of set-up (imports, model): 1 emulated second, not 4.8
    assert clock.now() == pytest.approx(1.0) and not clock.loop_started
    held = clock.hold()
    assert held[0] == pytest.approx(1.0)
    clock.finish(held, 1.25)  # the first collective ends at 1.25: the loop starts there
    assert clock.loop_started and clock.now() == pytest.approx(1.25)
    wall[0] = 1.5  # half a second of the loop's compute: 4.8 x 0.5
    assert clock.now() == pytest.approx(1.25 + 2.4)


def test_start_loop_starts_the_devices_speed_before_any_operation_once():
    clock, wall = _clock(3.0)
    wall[0] = 2.0
    clock.start_loop()  # a local-SGD loop whose first collective comes after a period
    assert clock.now() == pytest.approx(2.0)
    wall[0] = 3.0
    assert clock.now() == pytest.approx(5.0)
    clock.start_loop()  # again: nothing changes
    assert clock.now() == pytest.approx(5.0)


def test_host_work_counts_at_this_machines_speed_and_its_operations_do_not_start_the_loop():
    clock, wall = _clock(3.0)
    with clock.host_work():  # set-up that runs a collective of its own (train's broadcast of a time split)
        wall[0] = 1.0
        clock.finish(clock.hold(), 1.5)
        wall[0] = 2.0
        assert clock.now() == pytest.approx(2.5) and not clock.loop_started
    wall[0] = 3.0  # after the block, still set-up until the next operation
    assert clock.now() == pytest.approx(3.5)
    clock.finish(clock.hold(), 3.5)  # the start line's barrier
    wall[0] = 4.0
    assert clock.loop_started and clock.now() == pytest.approx(6.5)
    with clock.host_work():  # inside the loop: host work at this machine's speed, the loop's rate after it
        wall[0] = 5.0
        assert clock.now() == pytest.approx(7.5)
    wall[0] = 6.0
    assert clock.now() == pytest.approx(10.5)
