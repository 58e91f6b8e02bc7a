"""The iteration prediction of the runtime: the schedule simulation with measured compute, ring DP in
replica order, sends finished before the all-reduce, NIC sharing; and the no-overlap yuan/ring views."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.cluster import make_network
from geotrain.cost.ring import RingCostModel, ring_allreduce_seconds
from geotrain.cost.schedule import schedule_seconds, simulate_pipeline_sends
from geotrain.emulate import EmulatedNetwork, algorithms, run_rounds
from geotrain.runtime.predict import measured_traffic, predict_comm, predict_iteration_s

CLUSTER = make_network([4, 4], 10.0, (0.005, 0.005), (40.0, 40.0), seed=0)
DP_BYTES = [1_657_856, 1_609_728]


@pytest.mark.parametrize("assignment", [[[0, 4, 1, 5], [6, 2, 7, 3]], [[0, 1, 4, 5], [2, 6, 3, 7]]],
                         ids=["alternating", "paired"])
def test_ring_in_replica_order_equals_the_emulators_rounds_and_never_beats_the_best_ring(assignment):
    got = ring_allreduce_seconds(CLUSTER, np.array(assignment), np.array(DP_BYTES, float))
    net = EmulatedNetwork.from_cluster(CLUSTER)
    for stage, group in enumerate(assignment):
        _, end = run_rounds(net, group, list(range(4)), algorithms.ring_allreduce(4, DP_BYTES[stage]), 0.0)
        assert got[stage] == pytest.approx(end, rel=1e-9)
    best = RingCostModel(CLUSTER, measured_traffic([DP_BYTES[0]] * 2, 1, 4)).stage_dp_seconds(np.array(assignment))
    assert got[0] >= best[0] - 1e-12
    if assignment[0] == [0, 1, 4, 5]:  # two crossings of the ring, like the best ring: same time
        assert got[0] == pytest.approx(best[0])


def test_a_nic_caps_every_ring_message():
    group = np.array([[0, 1, 2, 3]])
    fast = ring_allreduce_seconds(CLUSTER, group, np.array([4e6]))
    capped = ring_allreduce_seconds(CLUSTER, group, np.array([4e6]), nic_bps=np.full(8, 1e9))
    # 6 rounds of 1 MB: at 10 Gbit/s 0.8 ms + 0.1 ms, at the 1 Gbit/s NIC 8 ms + 0.1 ms
    assert fast[0] == pytest.approx(6 * (0.8e-3 + 0.1e-3)) and capped[0] == pytest.approx(6 * (8e-3 + 0.1e-3))


def test_a_stage_starts_its_all_reduce_only_after_its_last_message_left():
    """The hand timeline of test_cost_schedule (f = 1 s, busy 0.5 s, latency 0.25 s, M = 2, GPipe):
    stage 1's last backward ends at 7.75, its gradient message occupies the link until 8.25."""
    ends, ready = simulate_pipeline_sends(np.array([1.0, 1.0]), np.array([0.5]), np.array([0.25]), 2, "gpipe")
    np.testing.assert_allclose(ends, [10.5, 7.75])
    np.testing.assert_allclose(ready, [10.5, 8.25])


def test_a_shared_nic_serialises_a_middle_stages_two_directions():
    """3 stages, M = 3: in 1F1B stage 1 sends activations forward while gradients go back; with a NIC
    as slow as each link the two queues become one and the pipeline ends later. GPipe never sends
    both ways at once: no change."""
    forward, busy, latency = np.full(3, 0.1), np.full(2, 1.0), np.zeros(2)
    for kind in ("1f1b", "gpipe"):
        free, _ = simulate_pipeline_sends(forward, busy, latency, 3, kind)
        shared, _ = simulate_pipeline_sends(forward, busy, latency, 3, kind, nic_busy_s=np.full(3, 1.0))
        unlimited, _ = simulate_pipeline_sends(forward, busy, latency, 3, kind, nic_busy_s=np.zeros(3))
        np.testing.assert_allclose(unlimited, free)
        if kind == "1f1b":
            assert shared[0] > free[0] + 0.5
        else:
            np.testing.assert_allclose(shared, free)


def test_schedule_prediction_with_compute_only_is_the_bubble_formula():
    """Time scale 0 (plain gloo): (M + S - 1) x 3 f for uniform stages, whatever the links."""
    assignment = np.array([[0, 1], [2, 3], [4, 5], [6, 7]])  # S = 4, R = 2
    M, f = 4, 0.05
    got = predict_iteration_s(CLUSTER, assignment, np.full((4, 2), 3 * M * f), DP_BYTES * 2, 393_216, M, "gpipe", 0.0)
    assert got == pytest.approx((M + 4 - 1) * 3 * f)


def test_work_after_the_schedule_follows_the_all_reduce_where_it_does_not_hide_behind_links():
    """One replica over the 5 Mbit/s / 40 ms link, M = 2, GPipe; messages of 62.5 kB: 0.1 s busy. Each slot
    works 0.3 s in the schedule (f = 0.05 s). Stage 0 hands over at 0.05 and 0.10; the link delivers at
    0.19 and 0.29; stage 1: F 0.19-0.24, 0.29-0.34, B 0.34-0.44, 0.44-0.54; gradients leave 0.44 and 0.54
    and arrive 0.58 and 0.68; stage 0: B 0.58-0.68, 0.68-0.78. Stage 0's 0.3 s after the schedule (its
    optimizer) follows: 1.08. Spread over its micro-batches as compute (f = 0.1 s), its second forward's
    share hides behind the busy link: 1.03, 0.05 s short. ring / yuan: comm + the slowest slot's 0.6 s."""
    assignment = np.array([[0], [4]])
    inside, after = np.array([[0.3], [0.3]]), np.array([[0.3], [0.0]])
    args = ([0, 0], 125_000, 2, "gpipe", 1.0)
    assert predict_iteration_s(CLUSTER, assignment, inside, *args, slot_after_s=np.zeros((2, 1))) == pytest.approx(0.78)
    assert predict_iteration_s(CLUSTER, assignment, inside, *args, slot_after_s=after) == pytest.approx(1.08)
    assert predict_iteration_s(CLUSTER, assignment, inside + after, *args) == pytest.approx(1.03)
    comm = predict_comm(CLUSTER, assignment, [0, 0], 125_000, 1.0, "ring")
    assert predict_iteration_s(CLUSTER, assignment, inside, *args, "ring", slot_after_s=after) == pytest.approx(
        comm.total_s + 0.6)
    # plain gloo (compute only): stage 0 ends its backward at 9 f = 0.45 (F 0-0.1, B 0.25-0.45), then 0.3 s
    assert predict_iteration_s(CLUSTER, assignment, inside, [0, 0], 125_000, 2, "gpipe", 0.0,
                               slot_after_s=after) == pytest.approx(0.75)


def test_a_records_work_splits_where_the_schedule_returns():
    from geotrain.runtime.report import slot_work_s

    emulated = {"compute_s": 0.20, "sync_compute_s": 0.03, "pipeline_busy_s": 0.21,
                "emulated": {"start_s": 1.0, "end_s": 1.5, "busy_s": 0.26}}
    assert slot_work_s(emulated) == pytest.approx((0.21, 0.05))  # the rank's own seconds on its clock
    plain = {"compute_s": 0.20, "sync_compute_s": 0.03, "pipeline_busy_s": None, "emulated": None}
    assert slot_work_s(plain) == pytest.approx((0.17, 0.03))  # the timed compute, the sync's part after
    assert slot_work_s({"compute_s": 0.2}) == pytest.approx((0.2, 0.0))  # an older record


def test_time_scale_scales_link_time_and_not_compute():
    assignment = np.array([[0, 4, 1, 5], [6, 2, 7, 3]])
    compute = np.full((2, 4), 0.2)
    one = predict_iteration_s(CLUSTER, assignment, compute, DP_BYTES, 393_216, 4, "gpipe", 1.0)
    scaled = predict_iteration_s(CLUSTER, assignment, compute * 0.25, DP_BYTES, 393_216, 4, "gpipe", 0.25)
    assert scaled == pytest.approx(0.25 * one)
    ready, dp = schedule_seconds(CLUSTER, assignment, np.full(8, 0.2 / 12), 393_216 / 4, np.array(DP_BYTES, float), 4,
                                 "gpipe", allreduce="ring")
    assert one == pytest.approx(float((ready + dp).max()))


@pytest.mark.parametrize("model", ["yuan", "ring"])
def test_no_overlap_views_add_the_slowest_slots_compute_to_the_models_comm(model):
    assignment = np.array([[0, 4, 1, 5], [6, 2, 7, 3]])
    compute = np.array([[0.1, 0.2, 0.3, 0.1], [0.4, 0.1, 0.1, 0.1]])
    comm = predict_comm(CLUSTER, assignment, DP_BYTES, 393_216, 1.0, model)
    got = predict_iteration_s(CLUSTER, assignment, compute, DP_BYTES, 393_216, 4, "gpipe", 1.0, model)
    assert got == pytest.approx(comm.total_s + 0.4)


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="--cost-model"):
        predict_iteration_s(CLUSTER, np.array([[0], [1]]), np.ones((2, 1)), [1, 1], 8, 1, "gpipe", 1.0, "dtfm")


def test_emulated_periods_are_the_spacing_of_each_steps_first_activation_message():
    from geotrain.runtime.report import emulated_periods_s

    def record(step, replica, start):  # [kind, cut, micro, nbytes, handoff (emulated x scale), end]
        return {"step": step, "replica": replica, "transfers": [["fwd", 0, 1, 8, start + 0.3, start + 0.4],
                                                                ["fwd", 0, 0, 8, start, start + 0.1],
                                                                ["bwd", 0, 0, 8, start - 0.5, start]]}
    by_step = {0: [record(0, 0, 1.0), record(0, 1, 1.2)], 1: [record(1, 0, 2.0), record(1, 1, 2.5)],
               2: [record(2, 0, 3.5), record(2, 1, 3.6)]}
    assert emulated_periods_s(by_step, 0.5) == pytest.approx({0: (2.5 - 1.2) / 0.5, 1: (3.5 - 2.0) / 0.5})
    assert emulated_periods_s(by_step, 0.0) == {}
