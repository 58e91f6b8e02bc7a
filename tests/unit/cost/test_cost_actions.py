"""Schedule actions read from torch.distributed.pipelining, and the schedule model on every schedule
`geotrain train` runs, held to a pull-based reference simulation written independently here."""

from functools import lru_cache

import numpy as np
import pytest

from geotrain.cluster import make_network
from geotrain.cost import Action, ScheduleError, Traffic, schedule_actions
from geotrain.cost.schedule import ScheduleCostModel, simulate_actions, stage_allreduce_seconds
from geotrain.runtime.pipeline_schedules import PIPELINE_SCHEDULES as SCHEDULES
from geotrain.runtime.predict import predict_iteration_s


def todays_order(kind, stage, stages, microbatches):
    """The hand-coded GPipe / 1F1B order of cost/schedule.py before it read torch (kept as the pin)."""
    if kind == "gpipe":
        return [("F", m) for m in range(microbatches)] + [("B", m) for m in range(microbatches)]
    warmup = min(stages - 1 - stage, microbatches)
    order = [("F", m) for m in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", m) for m in range(microbatches - warmup, microbatches)]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_actions_are_todays_orders(kind):
    for stages in range(1, 7):
        for microbatches in range(1, 10):
            actions = schedule_actions(kind, stages, microbatches)
            for s in range(stages):
                assert [(a.op, a.microbatch) for a in actions[s]] == todays_order(kind, s, stages, microbatches)
                assert {a.stage for a in actions[s]} == {s}


def test_looped_bfs_runs_every_forward_stage_by_stage_then_the_backwards_in_reverse():
    actions = schedule_actions("looped-bfs", 2, 2, virtual=2)
    assert actions[0] == (Action("F", 0, 0), Action("F", 0, 1), Action("F", 2, 0), Action("F", 2, 1),
                          Action("B", 2, 1), Action("B", 2, 0), Action("B", 0, 1), Action("B", 0, 0))
    assert [a.stage for a in actions[1]] == [1, 1, 3, 3, 3, 3, 1, 1]


def test_interleaved_1f1b_alternates_after_its_warm_up():
    """torch's Interleaved1F1B, S = 2, M = 4, V = 2 (micro-batches per round = 2)."""
    text = [" ".join(f"{a.op}{a.stage}.{a.microbatch}" for a in ops) for ops in schedule_actions("interleaved-1f1b", 2, 4, 2)]
    assert text[0] == "F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3"
    assert text[1] == "F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3"


def test_bad_schedules_are_refused_with_the_value():
    with pytest.raises(ScheduleError, match="unknown pipeline schedule 'zb'"):
        schedule_actions("zb", 2, 2)
    with pytest.raises(ScheduleError, match="virtual stages must be an integer >= 2, got 1"):
        schedule_actions("looped-bfs", 2, 2, virtual=1)
    with pytest.raises(ScheduleError, match="multiple of 2"):
        schedule_actions("interleaved-1f1b", 2, 5, virtual=2)


def reference_ends(actions, forward, busy, latency):
    """Pull-based reference: every action's end as a memoised recursion over what it waits for (the
    device's previous action; its input message, itself behind the earlier messages of its directed
    device pair, in the sender's order). Returns (last backward, last send or backward) per device."""
    S, P = len(actions), len(forward)
    where = {(a.op, a.stage, a.microbatch): (s, k) for s, ops in enumerate(actions) for k, a in enumerate(ops)}
    messages = {}  # directed device pair -> [(op sending, stage, m, cut)] in the sender's order
    for s, ops in enumerate(actions):
        for a in ops:
            if a.op == "F" and a.stage < P - 1:
                messages.setdefault((s, (a.stage + 1) % S), []).append((a, a.stage))
            if a.op == "B" and a.stage > 0:
                messages.setdefault((s, (a.stage - 1) % S), []).append((a, a.stage - 1))

    @lru_cache(maxsize=None)
    def end(op, stage, m):
        s, k = where[(op, stage, m)]
        start = end(*actions[s][k - 1]) if k > 0 else 0.0
        if op == "F" and stage > 0:
            start = max(start, arrival(Action("F", stage - 1, m)))
        if op == "B" and stage < P - 1:
            start = max(start, arrival(Action("B", stage + 1, m)))
        return start + forward[stage] * (1.0 if op == "F" else 2.0)

    @lru_cache(maxsize=None)
    def leaves(sender_action):
        """When the message sent after `sender_action` has left its link."""
        s = where[tuple(sender_action)][0]
        receiver = ((sender_action.stage + 1) if sender_action.op == "F" else (sender_action.stage - 1)) % S
        if receiver == s:
            return end(*sender_action)
        queue = messages[(s, receiver)]
        k = [a for a, _ in queue].index(sender_action)
        before = leaves(queue[k - 1][0]) if k > 0 else 0.0
        return max(end(*sender_action), before) + busy[queue[k][1]]

    def arrival(sender_action):
        s = where[tuple(sender_action)][0]
        receiver = ((sender_action.stage + 1) if sender_action.op == "F" else (sender_action.stage - 1)) % S
        cut = sender_action.stage if sender_action.op == "F" else sender_action.stage - 1
        return leaves(sender_action) + (latency[cut] if receiver != s else 0.0)

    last_b = [end(*[a for a in ops if a.op == "B"][-1]) for ops in actions]
    sent = [max([last_b[s]] + [leaves(a) for (src, _), queue in messages.items() if src == s for a, _ in queue])
            for s in range(S)]
    return np.array(last_b), np.array(sent)


def test_hand_timeline_of_looped_bfs():
    """S = 2, V = 2, M = 1, forward 1 s per stage, messages busy 0.5 s + 0.25 s latency.
    d0 F0 0-1 -> d1 F1 1.75-2.75 -> (wrap) d0 F2 3.5-4.5 -> d1 F3 5.25-6.25, B3 -8.25 -> d0 B2 9-11
    -> d1 B1 11.75-13.75 (its gradient leaves at 14.25) -> d0 B0 14.5-16.5."""
    actions = schedule_actions("looped-bfs", 2, 1, virtual=2)
    ends, ready = simulate_actions(actions, np.ones(4), np.full(3, 0.5), np.full(3, 0.25))
    np.testing.assert_allclose(ends, [16.5, 13.75])
    np.testing.assert_allclose(ready, [16.5, 14.25])
    np.testing.assert_allclose(reference_ends(actions, np.ones(4), np.full(3, 0.5), np.full(3, 0.25))[1], ready)


CASES = [(kind, S, M, V) for kind, V in (("interleaved-1f1b", 2), ("interleaved-1f1b", 3), ("looped-bfs", 2),
                                         ("looped-bfs", 3), ("gpipe", 1), ("1f1b", 1))
         for S, M in ((2, 2), (2, 4), (3, 3), (3, 6), (4, 4), (4, 8), (1, 3))]


@pytest.mark.parametrize("kind,S,M,V", CASES)
def test_simulation_equals_the_pull_based_reference(kind, S, M, V):
    rng = np.random.default_rng(S * 100 + M * 10 + V)
    P = S * V
    forward, busy, latency = rng.uniform(0.1, 2.0, P), rng.uniform(0.0, 3.0, P - 1), rng.uniform(0.0, 1.0, P - 1)
    actions = schedule_actions(kind, S, M, V)
    ends, ready = simulate_actions(actions, forward, busy, latency)
    want_ends, want_ready = reference_ends(actions, forward, busy, latency)
    np.testing.assert_allclose(ends, want_ends, rtol=1e-12)
    np.testing.assert_allclose(ready, want_ready, rtol=1e-12)


CLUSTER = make_network([2, 2], 1.0, (0.5, 0.5), (30.0, 30.0), seed=3)


@pytest.mark.parametrize("kind", SCHEDULES)
def test_every_runtime_schedule_is_predicted_as_the_reference_plus_the_all_reduce(kind):
    """The model on a cluster: chains of devices, bytes per cut / M per message, stage v's forward
    1/V of its device's, each stage's all-reduce after its group's last backward and send."""
    V = 2 if kind in ("interleaved-1f1b", "looped-bfs") else 1
    S, R, M = 2, 2, 4
    assignment = np.array([[0, 1], [2, 3]])
    forward_s = np.array([0.02, 0.03, 0.025, 0.04])
    traffic = Traffic(dp_bytes=(2e6, 3e6), pp_bytes=(4e5,) * (S * V - 1), replicas=R)
    model = ScheduleCostModel(CLUSTER, traffic, forward_s, M, schedule=kind)
    actions = schedule_actions(kind, S, M, V)
    ready = np.zeros(S)
    for r in range(R):
        chain = assignment[:, r]
        cuts = np.arange(S * V - 1)
        src, dst = chain[cuts % S], chain[(cuts + 1) % S]
        busy = 8 * 4e5 / M / CLUSTER.bandwidth_bps[src, dst]
        forward = np.tile(forward_s[chain] / V, V)
        ready = np.maximum(ready, reference_ends(actions, forward, busy, CLUSTER.latency_s[src, dst])[1])
    dp = stage_allreduce_seconds(CLUSTER, assignment, np.array(traffic.dp_bytes))
    assert model.evaluate(assignment).total == pytest.approx(float((ready + dp).max()), rel=1e-12)


def test_looped_prediction_of_a_run_splits_rank_bytes_over_the_virtual_cuts():
    """predict_iteration_s for interleaved 1F1B: the runtime's record (rank 0 sends V x per-cut bytes)
    gives S V - 1 cuts of 1/V each; link time scales with time_scale, compute does not."""
    assignment = np.array([[0, 1], [2, 3]])
    compute = np.full((2, 2), 0.6)
    args = (CLUSTER, assignment, compute, [2e6, 3e6], 8e5, 4, "interleaved-1f1b")
    fast = predict_iteration_s(*args, 1e-9, "schedule", 2)
    assert fast == pytest.approx(predict_iteration_s(*args, 0.0, "schedule", 2), rel=1e-6)
    slow = predict_iteration_s(*args, 1.0, "schedule", 2)
    traffic = Traffic(dp_bytes=(2e6, 3e6), pp_bytes=(4e5,) * 3, replicas=2)
    forward = np.zeros(4)
    forward[assignment] = compute / 12
    model = ScheduleCostModel(CLUSTER, traffic, forward, 4, schedule="interleaved-1f1b", allreduce="ring")
    assert slow == pytest.approx(model.evaluate(assignment).total, rel=1e-12) and slow > fast + 0.1
