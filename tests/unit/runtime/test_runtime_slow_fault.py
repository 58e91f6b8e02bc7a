"""`--chaos slow:site=K,factor=F,at=T`: the parser, its place in the config, and the factor a worker applies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import load_cluster
from geotrain.emulate.clock import RankClock
from geotrain.runtime import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.elastic import ChaosSpecError, Slow, parse_chaos
from geotrain.runtime.slowdown import SlowDown, site_slowdowns, slow_factor
from geotrain.sync.base import ComputeTimer
from paths import ROOT

MIXED = load_cluster(str(ROOT / "examples" / "clusters" / "mixed-gpus-3x2.yaml"))


def test_slow_specs_parse_to_their_numbers():
    assert parse_chaos("slow:site=2,factor=3,at=10s") == (Slow(2, 3.0, 10.0),)
    assert parse_chaos("slow:site=0,factor=1.5") == (Slow(0, 1.5, 0.0),)
    assert parse_chaos("slow:site=1,factor=2,at=0;kill-site:every=5s")[0] == Slow(1, 2.0, 0.0)
    assert parse_chaos("slow:factor=4,site=1,at=500ms") == (Slow(1, 4.0, 0.5),)


@pytest.mark.parametrize("spec, words", [
    ("slow:site=1", "needs site=K and factor=F"),
    ("slow:factor=2", "needs site=K and factor=F"),
    ("slow:site=1,factor=0.5", "slow factor: must be a number in 1..1e+06"),
    ("slow:site=1,factor=x", "slow factor: must be a number in 1..1e+06"),
    ("slow:site=1,factor=inf", "slow factor: must be a number in 1..1e+06"),
    ("slow:site=1,factor=nan", "slow factor: must be a number in 1..1e+06"),
    ("slow:site=1,factor=1e300", "slow factor: must be a number in 1..1e+06 (how many times slower), got '1e300'"),
    ("slow:site=1,factor=1000001", "slow factor: must be a number in 1..1e+06"),
    ("slow:site=1,factor=1000;slow:site=1,factor=2000", "the factors of site 1 multiply to 2e+06, more than 1e+06"),
    ("slow:site=-1,factor=2", "slow site: must be an integer >= 0"),
    ("slow:site=1,factor=2,at=-3s", "slow at: duration must be a number > 0"),
    ("slow:site=1,factor=2,for=3s", "is not one of site=, factor=, at="),
    ("slow:site=1,factor=2,factor=3", "factor given twice"),
])
def test_bad_slow_specs_are_one_line_naming_the_part(spec, words):
    with pytest.raises(ChaosSpecError) as caught:
        parse_chaos(spec)
    assert words in str(caught.value) and "\n" not in str(caught.value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["site=1", "site=0", "site=x", "factor=2", "factor=0.9", "factor=1e3", "factor=",
                                 "factor=1e300", "factor=1e6", "at=3s", "at=0", "at=-1", "at=2m", "every=1s", "x=1",
                                 ""]), max_size=5))
def test_any_slow_spec_parses_or_is_one_line(parts):
    try:
        faults = parse_chaos("slow:" + ",".join(parts))
    except ChaosSpecError as exc:
        assert "\n" not in str(exc)
        return
    (fault,) = faults
    assert fault.site >= 0 and 1 <= fault.factor <= 1e6 and fault.at_s >= 0


def test_every_run_refuses_a_slow_site_beyond_its_replicas_in_one_line():
    """Not only elastic runs: a site the plan does not have would inject nothing."""
    assert RuntimeConfig.of(MIXED, [[0, 2, 4]], chaos="slow:site=2,factor=3").reliability.chaos is not None
    for assignment, words in (([[0, 2, 4]], "in 0..2, got 3"), ([[0, 2]], "in 0..1, got 3"),
                              ([[0], [2]], "in 0..0, got 3")):
        with pytest.raises(RuntimeConfigError) as caught:
            RuntimeConfig.of(MIXED, assignment, chaos="slow:site=3,factor=3")
        assert f"reliability.chaos: chaos slow: site must be a replica group {words}" == str(caught.value)


def test_slow_faults_run_without_elastic_and_are_refused_with_it():
    config = RuntimeConfig.of(MIXED, [[0, 2, 4]], chaos="slow:site=2,factor=3,at=1s")
    assert site_slowdowns(config.reliability.chaos, 2) == (Slow(2, 3.0, 1.0),)
    assert site_slowdowns(config.reliability.chaos, 0) == ()
    with pytest.raises(RuntimeConfigError, match="chaos is an elastic run's setting"):
        RuntimeConfig.of(MIXED, [[0, 2, 4]], chaos="slow:site=2,factor=3;kill-site:every=5s")
    with pytest.raises(RuntimeConfigError, match="slow faults run without reliability.elastic"):
        RuntimeConfig.of(MIXED, [[0, 2]], elastic=True, chaos="slow:site=1,factor=3")


def test_the_factor_multiplies_the_faults_due():
    faults = (Slow(1, 2.0, 5.0), Slow(1, 3.0, 10.0))
    assert [slow_factor(faults, t) for t in (0.0, 5.0, 9.9, 10.0)] == [1.0, 2.0, 2.0, 6.0]


class _State:
    def __init__(self, clock):
        self.clock = clock


class _Emulation:
    def __init__(self, clock):
        self._state = _State(clock)

    def state(self):
        return self._state


def test_under_emulation_the_clock_and_timer_count_the_factor_from_then_on():
    wall = [0.0]
    clock = RankClock(1.0, wall=lambda: wall[0], sleep=lambda s: None, compute_scale=2.0)
    clock.start_loop()  # in the loop: the device's factor applies (emulate/clock.py)
    timer = ComputeTimer(scale=2.0)
    slow = SlowDown((Slow(0, 3.0, 0.0),), timer, _Emulation(clock))
    wall[0] = 1.0  # one real second at the device's factor 2 before the fault is applied
    slow.before_step()
    assert clock.now() == pytest.approx(2.0) and clock.compute_scale == 6.0 and timer.scale == 6.0
    wall[0] = 1.5
    assert clock.now() == pytest.approx(2.0 + 3.0)
    slow.before_step()  # due again: nothing changes twice
    assert clock.compute_scale == 6.0 and timer.scale == 6.0


def test_gpu_speed_without_emulation_is_each_devices_slowness_slept_out_after_its_compute(monkeypatch):
    """--emulate-gpu-speed at --time-scale 0 (elastic asynchronous groups): a T4's group (312/65 x slower than the
    A100) sleeps (312/65 - 1) x its measured compute, counted as compute; the A100's group sleeps nothing."""
    import geotrain.runtime.slowdown as slowdown
    from geotrain.runtime.slowdown import gpu_speed_faults

    scale = RuntimeConfig.of(MIXED, [[0, 2, 4]], emulate_gpu_speed=True).compute_scale()
    assert gpu_speed_faults(scale, 4, 2) == (Slow(2, pytest.approx(312 / 65)),)
    assert gpu_speed_faults(scale, 0, 0) == () and gpu_speed_faults(None, 4, 2) == ()
    slept = []
    monkeypatch.setattr(slowdown.time, "sleep", slept.append)
    timer = ComputeTimer(clock=lambda: 0.0)
    slow = SlowDown(gpu_speed_faults(scale, 4, 2), timer, None)
    slow.before_step()
    slow.after_compute(0.5)
    assert slept == [pytest.approx((312 / 65 - 1) * 0.5)]
