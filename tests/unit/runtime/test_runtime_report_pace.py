"""The run report's per-device compute fraction when ranks are not in lock-step (adaptive local steps, asynchronous
outer updates: each rank's step indices are its own): each rank's compute over its own span, not over the
slowest rank's step with the same index."""

from __future__ import annotations

import pytest

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig
from geotrain.runtime.report import slot_compute_fraction


def _record(replica: int, step: int, start: float, end: float, compute: float, **extra: object) -> dict:
    return {"stage": 0, "replica": replica, "step": step, "compute_s": compute, "iteration_s": 0.01,
            "emulated": {"start_s": start, "end_s": end}, **extra}


def test_ranks_at_their_own_pace_are_measured_over_their_own_span():
    config = RuntimeConfig.of(load_cluster("seed-datacenter"), [[0, 1]])
    names = config.cluster.device_names
    # replica 0: 4 steps of 1 s compute in 5 s; replica 1: 1 step of 4 s compute, its span 0.5 .. 5.5 s
    fast = [_record(0, s, 1.25 * s, 1.25 * s + 1.25, 1.0, global_updates=s) for s in range(4)]
    slow = [_record(1, 0, 0.5, 5.5, 4.0, global_updates=4)]
    by_step: dict[int, list[dict]] = {}
    for record in fast + slow:
        by_step.setdefault(record["step"], []).append(record)
    fractions = slot_compute_fraction(config, by_step)
    assert fractions == {names[0]: pytest.approx(4 / 5), names[1]: pytest.approx(4 / 5)}
    # in lock-step terms (step 0 of both, the slowest's span) the fast one would read 1 / 5, and steps 1-3 > 1
