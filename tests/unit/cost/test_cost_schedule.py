"""The "schedule" cost model: event simulation held to hand-computed timelines, closed forms and the runtime's op order."""

import numpy as np
import pytest

from geotrain.cluster import region_cluster, seed_geo
from geotrain.cost import ScheduleCostModel, YuanCostModel, build_cost_model, pipeline_order, simulate_pipeline
from geotrain.job import GPT_13B_SEED, Job


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_two_stage_timeline_by_hand(kind):
    """f = 1 s forward (2 s backward) per micro-batch, messages busy 0.5 s + 0.25 s latency, M = 2.
    GPipe: stage 0 F 0-1, 1-2; stage 1 F 1.75-2.75, 2.75-3.75, B1 3.75-5.75, B0 5.75-7.75;
    grads arrive at stage 0 at 6.5 and 8.5: B1 6.5-8.5, B0 8.5-10.5. 1F1B: stage 1 F0 1.75-2.75,
    B0 -4.75, F1 -5.75, B1 -7.75; stage 0 B0 5.5-7.5, B1 8.5-10.5."""
    ends = simulate_pipeline(np.array([1.0, 1.0]), np.array([0.5]), np.array([0.25]), 2, kind)
    np.testing.assert_allclose(ends, [10.5, 7.75])


def test_fifo_link_queues_messages():
    """Sending is slower than computing (busy 3 s vs forward 1 s): activations queue on the link.
    M = 3, GPipe: sends end at 4, 7, 10 (+0 latency); stage 1 F at 4-5, 7-8, 10-11, then B 11-13,
    13-15, 15-17; gradients queue back: arrive 16, 19, 22; stage 0 B ends 18, 21, 24."""
    ends = simulate_pipeline(np.array([1.0, 1.0]), np.array([3.0]), np.array([0.0]), 3, "gpipe")
    np.testing.assert_allclose(ends, [24.0, 17.0])


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_free_network_gives_the_bubble_formula(kind):
    """Uniform stages, no communication: makespan (M + S - 1) x 3 f for both schedules."""
    S, M, f = 4, 6, 0.5
    ends = simulate_pipeline(np.full(S, f), np.zeros(S - 1), np.zeros(S - 1), M, kind)
    assert ends[0] == pytest.approx((M + S - 1) * 3 * f)


def hand_cluster():
    bw = np.array([[10.0, 1.0], [1.0, 10.0]])
    ms = np.array([[0.1, 250.0], [250.0, 0.1]])
    return region_cluster("hand", ["a", "b"], [2, 2], bw, ms, "V100")


# 2 params x seq x b / (S R M) = 5e13 FLOPs (seq 50, hidden 625 000: within the job limits) -> f = 1 s on a V100 at 40 %; 2 x hidden bytes per message = 0.5 s at 1 Gbit/s
HAND_JOB = Job(name="hand", params=1e12, seq_len=50, hidden=625_000, global_batch=4, layers=2, vocab=1)


def test_model_adds_each_stages_all_reduce_after_its_last_backward():
    cluster = hand_cluster()
    model = ScheduleCostModel.for_job(cluster, HAND_JOB, 2, 2, micro_batches=2, schedule="gpipe")
    assignment = np.array([[0, 1], [2, 3]])  # both replicas cross the 1 Gbit/s 250 ms link
    cost = model.evaluate(assignment)
    dp = YuanCostModel.for_job(cluster, HAND_JOB, 2, 2).stage_dp_seconds(assignment)
    assert cost.total == pytest.approx(max(10.5 + dp[0], 7.75 + dp[1]))
    assert cost.extra["pipeline"] == pytest.approx(10.5)
    many = model.evaluate_many(np.stack([assignment, assignment[::-1], assignment[:, ::-1]]))
    assert many[0] == pytest.approx(cost.total)
    assert many[1] == pytest.approx(model.evaluate(assignment[::-1]).total)


def test_after_seconds_follow_each_stages_all_reduce_in_series():
    """The hand timeline above (stage 0's last backward ends at 10.5; stage 1's at 7.75, its last gradient
    message leaves at 8.25), after_s per device 3, 1 | 0.5, 6: each stage's all-reduce ends, then its
    slowest replica works 3 s (stage 0) and 6 s (stage 1) before the next iteration: stage 1 decides."""
    cluster = hand_cluster()
    base = ScheduleCostModel.for_job(cluster, HAND_JOB, 2, 2, micro_batches=2, schedule="gpipe")
    model = ScheduleCostModel(cluster, base.traffic, base.forward_s, 2, schedule="gpipe",
                              after_s=np.array([3.0, 1.0, 0.5, 6.0]))
    assignment = np.array([[0, 1], [2, 3]])
    dp = YuanCostModel.for_job(cluster, HAND_JOB, 2, 2).stage_dp_seconds(assignment)
    cost = model.evaluate(assignment)
    assert cost.total == pytest.approx(max(10.5 + dp[0] + 3.0, 8.25 + dp[1] + 6.0)) == pytest.approx(14.25 + dp[1])
    assert cost.extra["pipeline"] == pytest.approx(10.5)
    assert cost.extra["exposed_dp"] == pytest.approx(dp[0])
    assert cost.extra["after"] == pytest.approx(14.25 + dp[1] - 10.5 - dp[0])
    assert model.evaluate_many(assignment[None])[0] == pytest.approx(cost.total)
    assert "after" not in base.evaluate(assignment).extra


def test_registered_and_ranks_seed_plans_like_yuan_compute():
    """On seed-geo the schedule model scores pipeline-local below dp-local as the seed says, and is
    at least the ideal compute time (the bubble-free 10.2 s)."""
    cluster = seed_geo()
    model = build_cost_model("schedule", cluster, GPT_13B_SEED, 4, 8)
    assert model.name == "schedule" and model.pairwise_terms() is None
    pipelines = np.arange(32).reshape(8, 4).T      # replica r on devices 4r..4r+3: inside a region
    groups = np.arange(32).reshape(4, 8)           # stage s on region s
    local, across = model.evaluate(pipelines).total, model.evaluate(groups).total
    assert local < across
    assert local >= GPT_13B_SEED.compute_seconds(32)


def test_auto_search_ranks_surrogate_finalists_with_the_schedule_model():
    from geotrain.search import PlacementProblem, run_search

    cluster = seed_geo()
    model = build_cost_model("schedule", cluster, GPT_13B_SEED, 4, 8)
    result = run_search("auto", PlacementProblem(cluster, model), seed=0)
    finalists = result.details["finalists"]
    assert result.cost.total == pytest.approx(min(finalists.values()))
    assert result.cost.total == pytest.approx(model.evaluate(result.assignment).total)
    assert result.lower_bound is None  # the surrogate's bound does not bound this model


def test_allreduce_from_traffic_equals_yuan_dp():
    from geotrain.cost.schedule import stage_allreduce_seconds

    cluster = seed_geo()
    rng = np.random.default_rng(3)
    batch = np.stack([rng.permutation(32)[:24].reshape(4, 6) for _ in range(3)])
    yuan = YuanCostModel.for_job(cluster, GPT_13B_SEED, 4, 6)
    got = stage_allreduce_seconds(cluster, batch, np.full(4, GPT_13B_SEED.dp_bytes(4)))
    np.testing.assert_allclose(got, yuan.stage_dp_seconds(batch), rtol=1e-12)


def reference_last_backward(forward, busy, latency, microbatches, kind):
    """Pull-based reference: every op's end as a memoised recursion over its predecessors (previous op
    on the device; the message it waits for, itself behind the previous message on its FIFO link)."""
    from functools import lru_cache

    S = len(forward)
    orders = [pipeline_order(kind, s, S, microbatches) for s in range(S)]
    index = [{op: k for k, op in enumerate(order)} for order in orders]
    backward_order = [[m for op, m in order if op == "B"] for order in orders]

    @lru_cache(maxsize=None)
    def end(s, op, m):
        k = index[s][(op, m)]
        start = end(s, *orders[s][k - 1]) if k > 0 else 0.0
        if op == "F" and s > 0:
            start = max(start, arrival_fwd(s - 1, m))
        if op == "B" and s < S - 1:
            start = max(start, arrival_bwd(s + 1, m))
        return start + forward[s] * (1.0 if op == "F" else 2.0)

    @lru_cache(maxsize=None)
    def link_free_fwd(s, m):  # link s -> s+1 after the message of micro-batch m (sent in order m = 0, 1, ...)
        return max(end(s, "F", m), link_free_fwd(s, m - 1) if m > 0 else 0.0) + busy[s]

    def arrival_fwd(s, m):
        return link_free_fwd(s, m) + latency[s]

    @lru_cache(maxsize=None)
    def link_free_bwd(s, m):  # link s -> s-1, messages in the order of stage s's backwards
        k = backward_order[s].index(m)
        before = link_free_bwd(s, backward_order[s][k - 1]) if k > 0 else 0.0
        return max(end(s, "B", m), before) + busy[s - 1]

    def arrival_bwd(s, m):
        return link_free_bwd(s, m) + latency[s - 1]

    return np.array([end(s, *orders[s][-1]) for s in range(S)])


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("case", range(6))
def test_simulation_equals_pull_based_reference(kind, case):
    rng = np.random.default_rng(case)
    S, M = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    forward, busy, latency = rng.uniform(0.1, 2.0, S), rng.uniform(0.0, 3.0, S - 1), rng.uniform(0.0, 1.0, S - 1)
    np.testing.assert_allclose(simulate_pipeline(forward, busy, latency, M, kind),
                               reference_last_backward(forward, busy, latency, M, kind), rtol=1e-12)
    # vectorised over a leading axis: each row as if alone
    batch = rng.uniform(0.1, 2.0, (3, S))
    together = simulate_pipeline(batch, np.tile(busy, (3, 1)), np.tile(latency, (3, 1)), M, kind)
    for row, ends in zip(batch, together):
        np.testing.assert_allclose(ends, simulate_pipeline(row, busy, latency, M, kind), rtol=1e-12)
