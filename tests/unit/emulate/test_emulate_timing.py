"""The emulator's timing model by hand: ring all-reduce rounds, FIFO links, NIC sharing, the rank clock."""

import numpy as np
import pytest

from geotrain.cluster import cluster_from_dict
from geotrain.emulate import EmulatedNetwork, EmulationError, run_rounds
from geotrain.emulate import algorithms
from geotrain.emulate.clock import RankClock
from geotrain.emulate.schedule import SenderQueues, inter_region_wire

# 4 devices: 0,1 in region a, 2,3 in region b; a-b 1 Gbit/s 50 ms, inside 10 Gbit/s 1 ms
FOUR = cluster_from_dict({"name": "t4", "regions": [
    {"name": "a", "devices": 2, "intra": {"gbps": 10, "ms": 1}},
    {"name": "b", "devices": 2, "intra": {"gbps": 10, "ms": 1}}],
    "links": [{"between": ["a", "b"], "gbps": 1, "ms": 50}]})


def test_ring_allreduce_of_four_ranks_takes_six_slowest_ring_steps():
    net = EmulatedNetwork.from_cluster(FOUR)
    nbytes = 4e6
    transfers, end = run_rounds(net, [0, 1, 2, 3], [0, 1, 2, 3], algorithms.ring_allreduce(4, nbytes), 2.0)
    # ring 0->1 (intra), 1->2, 2->3 (intra), 3->0: the slowest link is a-b: 50 ms + 8 x 1e6 / 1e9 s per step
    step = 0.050 + 8 * 1e6 / 1e9
    assert end == pytest.approx(2.0 + 6 * step, rel=1e-12)
    assert len(transfers) == 6 * 4
    assert {t.nbytes for t in transfers} == {1e6}
    assert sorted({(t.src_device, t.dst_device) for t in transfers}) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    intra = [t for t in transfers if (t.src_device, t.dst_device) == (0, 1)]
    assert intra[0].end_s - intra[0].start_s == pytest.approx(0.001 + 8e6 / 10e9)  # its own link, not the step
    # on the wire for its own link's time; it arrives one latency after its last byte left
    assert intra[0].wire_end_s - intra[0].start_s == pytest.approx(8e6 / 10e9)
    assert all(t.end_s - t.wire_end_s == pytest.approx(0.050 if (t.src_device < 2) != (t.dst_device < 2) else 0.001)
               for t in transfers)
    # between regions: 1 -> 2 and 3 -> 0 in each round, both 8 ms on their 1 Gbit/s links: one interval per round
    wire = inter_region_wire(transfers, FOUR.region_of)
    assert wire == [pytest.approx([2.0 + k * step, 2.0 + k * step + 0.008, 2e6]) for k in range(6)]


def test_ring_order_follows_the_device_list():
    net = EmulatedNetwork.from_cluster(FOUR)
    # devices 0,2,1,3: every ring link crosses regions
    _, end = run_rounds(net, [0, 2, 1, 3], [0, 1, 2, 3], algorithms.ring_allreduce(4, 4e6), 0.0)
    assert end == pytest.approx(6 * (0.050 + 8e6 / 1e9))


def test_point_to_point_messages_queue_fifo_and_pay_latency_once():
    queues = SenderQueues(EmulatedNetwork.from_cluster(FOUR), 0)
    first = queues.send(2, 1e6, 0.0)  # 8 ms on the 1 Gbit/s link, arrives 50 ms later
    second = queues.send(2, 1e6, 0.001)  # handed over while the first is on the wire
    assert first == pytest.approx((0.0, 0.008, 0.058))
    assert second == pytest.approx((0.008, 0.016, 0.066))
    late = queues.send(2, 1e6, 1.0)  # an idle link starts at once
    assert late == pytest.approx((1.0, 1.008, 1.058))


def test_a_senders_nic_is_shared_by_its_links():
    net = EmulatedNetwork.from_cluster(FOUR, nic_gbps=2.0)
    queues = SenderQueues(net, 0)
    to_1 = queues.send(1, 1e6, 0.0)  # 10 Gbit/s link, but the NIC gives 2 Gbit/s: 4 ms
    to_2 = queues.send(2, 1e6, 0.0)  # another link, same NIC: waits for it
    assert to_1 == pytest.approx((0.0, 0.004, 0.005))
    assert to_2 == pytest.approx((0.004, 0.012, 0.062))


def test_an_unlimited_nic_lets_messages_to_different_peers_overlap():
    queues = SenderQueues(EmulatedNetwork.from_cluster(FOUR), 0)
    slow = queues.send(2, 1e6, 0.0)  # 8 ms on the 1 Gbit/s link
    fast = queues.send(1, 1e6, 0.001)  # its own 10 Gbit/s link: not held behind the slow one
    assert slow == pytest.approx((0.0, 0.008, 0.058))
    assert fast == pytest.approx((0.001, 0.0018, 0.0028))
    # a NIC slower than the fast link: the second message waits for the NIC, not for the slow link
    capped = SenderQueues(EmulatedNetwork.from_cluster(FOUR, nic_gbps=2.0), 0)
    capped.send(2, 1e6, 0.0)  # NIC busy 4 ms, link 8 ms
    assert capped.send(1, 1e6, 0.0) == pytest.approx((0.004, 0.008, 0.009))


def test_all_to_all_round_is_bound_by_the_nic_sum_or_the_slowest_link():
    sends = np.full((4, 4), 1e6)
    unlimited, end_free = run_rounds(EmulatedNetwork.from_cluster(FOUR), [0, 1, 2, 3], [0, 1, 2, 3],
                                     algorithms.all_to_all(sends), 0.0)
    assert end_free == pytest.approx(0.050 + 8e6 / 1e9)  # each message alone on its link
    _, end_nic = run_rounds(EmulatedNetwork.from_cluster(FOUR, nic_gbps=1.0), [0, 1, 2, 3], [0, 1, 2, 3],
                            algorithms.all_to_all(sends), 0.0)
    assert end_nic == pytest.approx(0.050 + 8 * 3e6 / 1e9)  # three messages through one 1 Gbit/s NIC
    assert len(unlimited) == 12


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 13])
@pytest.mark.parametrize("root", [0, 1])
def test_binomial_broadcast_reaches_every_member_once_in_log_rounds(n, root):
    root = root % n
    rounds = algorithms.binomial_broadcast(n, root, 10.0)
    have = {root}
    for messages in rounds:
        for src, dst, _ in messages:
            assert src in have and dst not in have
        have |= {dst for _, dst, _ in messages}
    assert have == set(range(n))
    assert len(rounds) == (n - 1).bit_length()
    reduced = algorithms.binomial_reduce(n, root, 10.0)
    assert sorted(m for r in reduced for m in r) == sorted((d, s, b) for r in rounds for s, d, b in r)


def test_barrier_is_latency_only_and_allgather_moves_every_piece_round_the_ring():
    net = EmulatedNetwork.from_cluster(FOUR)
    _, end = run_rounds(net, [0, 1, 2, 3], [0, 1, 2, 3], algorithms.dissemination_barrier(4), 0.0)
    assert end == pytest.approx(2 * 0.050)
    transfers, end = run_rounds(net, [0, 1, 2, 3], [0, 1, 2, 3], algorithms.ring_allgather(4, 1e6), 0.0)
    assert end == pytest.approx(3 * (0.050 + 8e6 / 1e9))
    assert sum(t.nbytes for t in transfers) == 12e6


def test_rank_clock_freezes_while_blocked_and_sleeps_scaled_link_time():
    wall = [100.0]
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        wall[0] += seconds
    clock = RankClock(0.5, wall=lambda: wall[0], sleep=sleep)
    wall[0] += 1.0  # computing
    assert clock.now() == pytest.approx(1.0)
    held = clock.hold()
    wall[0] += 0.25  # blocked in the real exchange: not emulated time, but it counts towards the sleep
    clock.finish(held, 3.0)  # 2 emulated seconds of link time at time scale 0.5: 1 s of wall, 0.25 s done
    assert slept == [pytest.approx(0.75)]
    assert clock.now() == pytest.approx(3.0)
    held = clock.hold()
    wall[0] += 0.5  # blocked longer than the link time (0.25 s of wall): no sleep, 0.25 s behind
    clock.finish(held, 3.5)
    assert len(slept) == 1 and clock.now() == pytest.approx(3.5)
    clock.wait_until(2.0)  # already past: nothing
    assert len(slept) == 1 and clock.now() == pytest.approx(3.5)
    clock.wait_until(4.5)  # 0.5 s of wall, less the 0.25 s it is behind
    assert slept[-1] == pytest.approx(0.25) and clock.now() == pytest.approx(4.5)
    # waited_s: the jumps 1 -> 3, 3 -> 3.5 and 3.5 -> 4.5 (3.5 s blocked); the rest of the clock is compute
    assert clock.waited_s == pytest.approx(3.5)
    wall[0] += 0.2  # computing again
    assert clock.now() - clock.waited_s == pytest.approx(1.2)


def test_bad_inputs_name_the_option():
    with pytest.raises(EmulationError, match="--time-scale"):
        EmulatedNetwork.from_cluster(FOUR, time_scale=-1)
    with pytest.raises(EmulationError, match="nic_gbps"):
        EmulatedNetwork.from_cluster(FOUR, nic_gbps=0.0)


@pytest.mark.parametrize("assignment", [[[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4, 1, 5], [6, 2, 7, 3]]],
                         ids=["groups-inside-regions", "groups-crossing"])
def test_emulated_ring_allreduce_equals_the_independent_ring_cost_model(assignment):
    # two independent implementations of one algorithm: the emulator's rounds and cost/ring.py's formula
    from geotrain.cluster import make_network
    from geotrain.runtime.predict import predict_comm
    cluster = make_network([4, 4], 10.0, (0.005, 0.005), (40.0, 40.0), seed=0)
    dp_bytes = [1_657_856, 1_609_728]
    ring = predict_comm(cluster, np.array(assignment), dp_bytes, 393_216, 1.0, cost_model="ring")
    net = EmulatedNetwork.from_cluster(cluster)
    for stage, group in enumerate(assignment):
        _, end = run_rounds(net, group, list(range(4)), algorithms.ring_allreduce(4, dp_bytes[stage]), 0.0)
        assert end == pytest.approx(ring.dp_per_stage_s[stage], rel=1e-9)
