"""The cost models beside "yuan": ring, yuan+compute, dtfm; and their kernels (bottleneck matching, rings)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import region_cluster, seed_datacenter, seed_geo
from geotrain.cost import COST_MODELS, YuanCostModel, build_cost_model
from geotrain.cost.compute import YuanComputeCostModel
from geotrain.cost.dtfm import DtfmCostModel, min_sum_open_path
from geotrain.cost.gpus import UnknownGpuError, gpu_peak_flops
from geotrain.cost.matching import bottleneck_assignment, bottleneck_ring
from geotrain.cost.ring import RingCostModel
from geotrain.job import GPT_13B_SEED, Job

TINY = Job("tiny", params=1e9, seq_len=1024, hidden=1024, global_batch=8, bytes_per_value=2)


def two_region(sizes=(2, 2), intra=(10.0, 1.0), inter=(1.0, 50.0), gpus="V100"):
    """Regions a, b; intra (gbps, ms) inside both, inter (gbps, ms) between."""
    bw = np.array([[intra[0], inter[0]], [inter[0], intra[0]]])
    ms = np.array([[intra[1], inter[1]], [inter[1], intra[1]]])
    return region_cluster("two", ["a", "b"], list(sizes), bw, ms, gpus)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_bottleneck_assignment_equals_brute_force(n, seed):
    cost = np.random.default_rng(seed).integers(0, 6, size=(n, n)).astype(float)
    value, perm = bottleneck_assignment(cost)
    brute = min(max(cost[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
    assert value == brute
    assert sorted(perm.tolist()) == list(range(n))
    assert max(cost[i, perm[i]] for i in range(n)) == value
    # among bottleneck-optimal permutations, the cheapest sum
    best_sum = min(sum(cost[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n))
                   if max(cost[i, p[i]] for i in range(n)) == brute)
    assert sum(cost[i, perm[i]] for i in range(n)) == best_sum


@settings(max_examples=40, deadline=None)
@given(st.integers(3, 8), st.integers(0, 2**31 - 1))
def test_ring_order_equals_brute_force_for_small_groups(n, seed):
    w = np.random.default_rng(seed).random((n, n))
    w = w + w.T
    value, order = bottleneck_ring(w)
    brute = min(max(w[p[k], p[(k + 1) % n]] for k in range(n)) for p in itertools.permutations(range(n)) if p[0] == 0)
    assert value == pytest.approx(brute, rel=1e-12)
    assert sorted(order.tolist()) == list(range(n))
    assert max(w[order[k], order[(k + 1) % n]] for k in range(n)) == pytest.approx(value, rel=1e-12)


def test_heuristic_ring_is_a_valid_ring_no_worse_than_identity():
    w = np.random.default_rng(3).random((40, 40))
    w = w + w.T
    value, order = bottleneck_ring(w)
    assert sorted(order.tolist()) == list(range(40))
    assert value == pytest.approx(max(w[order[k], order[(k + 1) % 40]] for k in range(40)))
    assert value <= max(w[k, (k + 1) % 40] for k in range(40))


def test_ring_all_reduce_by_hand():
    # One stage of 4 devices, 2 per region: the best ring crosses regions twice; its slowest step
    # sends 1/4 of c_dp over the 1 Gbit/s, 50 ms link.
    cluster = two_region()
    model = RingCostModel.for_job(cluster, TINY, stages=1, replicas=4)
    cost = model.evaluate(np.array([[0, 2, 1, 3]]))
    step = 0.050 + 8 * (TINY.dp_bytes(1) / 4) / 1e9
    assert cost.dp == pytest.approx(2 * 3 * step)
    assert cost.pp == 0.0
    ring = model.ring_order(np.array([0, 2, 1, 3]))
    regions = cluster.region_of[ring]
    assert sum(regions[k] != regions[(k + 1) % 4] for k in range(4)) == 2


def test_ring_uniform_group_matches_closed_form():
    # datacenter: every link alike, so dp = 2(n-1)/n * 8 c_dp / b + 2(n-1) a
    model = RingCostModel.for_job(seed_datacenter(), GPT_13B_SEED, stages=4, replicas=8)
    cost = model.evaluate(np.arange(32).reshape(4, 8))
    n, b, a = 8, 25e9, 0.1e-3
    assert cost.dp == pytest.approx(2 * (n - 1) / n * 8 * GPT_13B_SEED.dp_bytes(4) / b + 2 * (n - 1) * a)
    assert cost.pp == pytest.approx(YuanCostModel.for_job(seed_datacenter(), GPT_13B_SEED, 4, 8).evaluate(np.arange(32).reshape(4, 8)).pp)


def test_compute_homogeneous_matches_seed_figure_plus_bubble():
    model = YuanComputeCostModel.for_job(seed_datacenter(), GPT_13B_SEED, stages=4, replicas=8)
    cost = model.evaluate(np.arange(32).reshape(4, 8))
    slot = GPT_13B_SEED.compute_seconds(32)  # 10.2 s: the seed's figure
    assert model.slot_seconds[0] == pytest.approx(slot)
    assert cost.extra["compute"] == pytest.approx(slot * (128 + 3) / 128)
    comm = YuanCostModel.for_job(seed_datacenter(), GPT_13B_SEED, 4, 8).evaluate(np.arange(32).reshape(4, 8))
    assert cost.total == pytest.approx(comm.total + cost.extra["compute"])


def test_compute_formula_by_hand_on_mixed_gpus():
    cluster = two_region(gpus=["T4", "A100"])
    model = YuanComputeCostModel.for_job(cluster, TINY, stages=2, replicas=2, micro_batches=4)
    t4 = TINY.flops_per_iteration() / 4 / (65e12 * 0.4)
    a100 = TINY.flops_per_iteration() / 4 / (312e12 * 0.4)
    per_replica = model.replica_compute_seconds(np.array([[0, 2], [1, 3]]))
    assert per_replica.tolist() == pytest.approx([(2 * t4) / 4 + t4 * 3 / 4, (2 * a100) / 4 + a100 * 3 / 4])
    mixed = model.replica_compute_seconds(np.array([[0, 1], [2, 3]]))  # each replica: one T4 then one A100
    assert mixed.tolist() == pytest.approx([(t4 + a100) / 4 + t4 * 3 / 4] * 2)


def test_heterogeneous_gpus_change_the_best_plan():
    # 2 T4 on a fast LAN, 2 A100 on a slower one: "yuan" keeps the pipeline on the T4s, compute moves it.
    cluster = two_region(intra=(100.0, 0.1), inter=(1.0, 20.0), gpus=["T4", "A100"])
    plans = [np.array(p).reshape(2, 1) for p in itertools.permutations(range(4), 2)]
    best = {}
    for name in ("yuan", "yuan+compute"):
        model = build_cost_model(name, cluster, TINY, 2, 1)
        totals = model.evaluate_many(np.stack(plans))
        best[name] = set(plans[int(np.argmin(totals))].ravel().tolist())
    assert best["yuan"] == {0, 1}
    assert best["yuan+compute"] == {2, 3}


def test_gpu_table_lookup():
    assert gpu_peak_flops("V100") == 125e12
    assert gpu_peak_flops("a100") == 312e12
    assert gpu_peak_flops("rtx-3090") == 71e12
    with pytest.raises(UnknownGpuError, match="unknown GPU type 'Z80'"):
        gpu_peak_flops("Z80")


def test_dtfm_by_hand_and_wiring_invariance():
    cluster = two_region(intra=(10.0, 1.0), inter=(1.0, 50.0))
    model = DtfmCostModel.for_job(cluster, TINY, stages=2, replicas=2)
    # groups {a0, b0} and {a1, b1}: the best matching pairs a0-a1, b0-b1 (inside regions)
    crossed = model.evaluate(np.array([[0, 2], [3, 1]]))
    straight = model.evaluate(np.array([[0, 2], [1, 3]]))
    one_way = 0.001 + 8 * TINY.pp_bytes(2) / 10e9
    assert crossed.pp == pytest.approx(2 * one_way)
    assert straight.total == pytest.approx(crossed.total)
    assert crossed.dp == pytest.approx(YuanCostModel.for_job(cluster, TINY, 2, 2).evaluate(np.array([[0, 2], [1, 3]])).dp)


def test_dtfm_is_at_least_yuan_of_its_own_wiring_on_random_plans():
    cluster = seed_geo()
    model = DtfmCostModel.for_job(cluster, GPT_13B_SEED, 4, 8)
    yuan = YuanCostModel.for_job(cluster, GPT_13B_SEED, 4, 8)
    rng = np.random.default_rng(0)
    for _ in range(10):
        assignment = rng.permutation(32).reshape(4, 8)
        _, order, wired = model.best_order(assignment)
        assert sorted(order.tolist()) == [0, 1, 2, 3]
        assert sorted(wired.ravel().tolist()) == list(range(32))
        assert model.evaluate(assignment).total >= yuan.evaluate(wired).total - 1e-9


def test_open_path_dp_equals_brute_force():
    w = np.random.default_rng(1).random((6, 6))
    w = w + w.T
    value, order = min_sum_open_path(w)
    brute = min(sum(w[p[k], p[k + 1]] for k in range(5)) for p in itertools.permutations(range(6)))
    assert value == pytest.approx(brute)
    assert sum(w[order[k], order[k + 1]] for k in range(5)) == pytest.approx(value)


@pytest.mark.parametrize("name", sorted(COST_MODELS))
def test_every_model_evaluate_many_matches_evaluate(name):
    cluster = seed_geo()
    model = build_cost_model(name, cluster, GPT_13B_SEED, 4, 6)
    rng = np.random.default_rng(7)
    batch = np.stack([rng.permutation(32)[:24].reshape(4, 6) for _ in range(6)])
    totals = model.evaluate_many(batch)
    assert totals.shape == (6,)
    for assignment, total in zip(batch, totals):
        cost = model.evaluate(assignment)
        assert total == pytest.approx(cost.total, rel=1e-12)
        assert cost.dp == pytest.approx(cost.dp_per_stage.max())
        assert cost.total >= cost.dp
