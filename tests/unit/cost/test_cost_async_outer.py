"""Asynchronous DiLoCo in the cost model (cost.async_outer): each replica's period with its blocking round trip to
the server, the server's uplink, the staleness bound, the staleness factor; and the planner's sync-vs-async choice
(cost.wan_recipe.choose_local_steps with asynchronous=True)."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.cluster import load_cluster
from geotrain.comm.gather import GatherLinks
from geotrain.cost.async_outer import AsyncPriceError, async_outer_price
from geotrain.cost.wan_recipe import WanRecipe, async_recipe, charged_step_seconds, choose_local_steps
from geotrain.job import Job
from paths import ROOT
from two_gpus import LAN_GPUS_YAML

HETERO = load_cluster(str(ROOT / "src" / "geotrain" / "bench" / "data" / "hetero-4x1.yaml"))  # A100 V100 L4 T4
TINY = Job(name="tiny", params=816896.0, seq_len=96, hidden=128, global_batch=32, layers=4, bytes_per_value=4)


def _links(latency_s: float, bps: float, nic_bps: float = np.inf, n: int = 2) -> GatherLinks:
    off = ~np.eye(n, dtype=bool)
    return GatherLinks.of(np.where(off, latency_s, 0.0), np.where(off, bps, 0.0), np.full(n, nic_bps), range(n))


def test_a_period_is_h_steps_and_the_blocking_round_trip_and_the_step_shares_the_rates():
    price = async_outer_price([1.0, 4.0], 2, 1e6, _links(0.05, 1e9), staleness_bound=8, staleness_power=0.5)
    # replica 0 holds the server (no link); replica 1: 2 x 50 ms + 8e6 bit up and down at 1 Gbit/s
    trip = 0.1 + 2 * 8e6 / 1e9
    p0, p1 = 2.0, 8.0 + trip
    assert price.round_trip_s == pytest.approx((0.0, trip))
    assert price.period_s == pytest.approx((p0, p1))
    assert price.step_s == pytest.approx(2 / (2 / p0 + 2 / p1))  # 2 replicas' inner steps per global step
    assert price.compute_fraction == pytest.approx((1.0, 8.0 / p1))
    s0, s1 = p0 / p1, p1 / p0  # the other's updates while one computes
    assert price.staleness == pytest.approx((s0, s1))
    fresh, weighted = 1 / p0 + 1 / p1, (1 + s0) ** -0.5 / p0 + (1 + s1) ** -0.5 / p1
    assert price.staleness_factor == pytest.approx(fresh / weighted)
    assert price.charged_step_s == pytest.approx(price.step_s * fresh / weighted)


def test_the_staleness_bound_holds_the_fast_replica():
    free = async_outer_price([1.0, 10.0], 1, 1e3, _links(0.0, 1e12), staleness_bound=100)
    held = async_outer_price([1.0, 10.0], 1, 1e3, _links(0.0, 1e12), staleness_bound=2)
    assert free.staleness[1] == pytest.approx(10.0, rel=1e-6)  # the fast one's 10 updates per slow period
    assert held.period_s[1] == pytest.approx(free.period_s[1])
    assert held.period_s[1] / held.period_s[0] == pytest.approx(2.0)  # held to 2 updates per slow period
    assert held.staleness[1] == pytest.approx(2.0)
    assert held.compute_fraction[0] == pytest.approx(0.2, rel=1e-6) and held.step_s > free.step_s


def test_bound_zero_is_synchronous_every_replica_at_the_slowest_pace_and_fresh():
    price = async_outer_price([1.0, 3.0, 2.0], 2, 1e3, _links(0.0, 1e12, n=3), staleness_bound=0)
    assert price.period_s == pytest.approx((6.0, 6.0, 6.0), rel=1e-6)
    assert price.staleness == (0.0, 0.0, 0.0) and price.staleness_factor == pytest.approx(1.0)
    assert price.step_s == pytest.approx(3.0, rel=1e-6)  # H x the slowest step


def test_the_servers_uplink_stretches_the_remote_periods():
    # every NIC 4 Mbit/s: a remote round trip is 8e6 bit up and down, 2 s each, so a period is 1 + 4 = 5 s; the 3
    # remote replies need 3 x 8e6 / 5 = 4.8 Mbit/s of the server's 4: every remote period stretches 1.2x, to 6 s
    price = async_outer_price([0.5] * 4, 2, 1e6, _links(0.0, 1e12, nic_bps=4e6, n=4), staleness_bound=100)
    assert price.round_trip_s[1:] == pytest.approx((4.0, 4.0, 4.0))
    assert price.period_s == pytest.approx((1.0, 6.0, 6.0, 6.0))
    assert sum(8e6 / p for p in price.period_s[1:]) == pytest.approx(4e6)


@pytest.mark.parametrize("args, match", [(([0.1, 0.2], 0, 1e6), "sync_every"), (([0.1, 0.2], 2, 0.0), "model bytes"),
                                         (([0.1], 2, 1e6), "2 members' links"),
                                         (([0.1, -1.0], 2, 1e6), "finite numbers > 0")])
def test_bad_settings_are_refused_in_one_line(args, match):
    with pytest.raises((AsyncPriceError, ValueError), match=match):
        async_outer_price(*args, _links(0.01, 1e9), staleness_bound=8)


def test_on_the_wan_bench_cluster_the_planner_keeps_synchronous_adaptive_steps():
    compute = 0.5 * 65 / np.array([312, 125, 121, 65])  # the T4's 0.5 s, by peak elsewhere
    recipe = choose_local_steps(HETERO, TINY, np.array([[0, 1, 2, 3]]), compute, total_steps=60, asynchronous=True)
    assert recipe.outer_sync == "sync" and recipe.local_steps == "adaptive"
    assert set(recipe.outer_sync_step_s) == {"sync", "async"}  # fp32 round trips over 100 Mbit/s cost more
    assert recipe.outer_sync_step_s["async"] > recipe.outer_sync_step_s["sync"] == recipe.step_s
    plain = choose_local_steps(HETERO, TINY, np.array([[0, 1, 2, 3]]), compute, total_steps=60)
    assert plain.outer_sync_step_s is None and plain.sync_every == recipe.sync_every


def test_where_links_are_fast_async_wins_and_train_gets_it(tmp_path):
    (tmp_path / "c.yaml").write_text(LAN_GPUS_YAML)
    cluster = load_cluster(str(tmp_path / "c.yaml"))
    compute = [0.1, 0.1 * 312 / 65]
    recipe = choose_local_steps(cluster, TINY, np.array([[0, 1]]), compute, total_steps=600, asynchronous=True)
    assert recipe.outer_sync == "async" and recipe.local_steps_step_s["adaptive"] < recipe.local_steps_step_s["equal"]
    assert charged_step_seconds(recipe) < recipe.outer_sync_charged_s["sync"]
    assert recipe.replica_compute_fraction[0] > 0.9  # the A100 no longer waits
    settings = recipe.runtime_settings()
    assert settings["optim"]["outer_sync"] == "async" and settings["comm"]["dp_codec"] == "none"
    assert "sync_moments" not in settings["optim"]
    assert WanRecipe.from_json(recipe.to_json()) == recipe


def test_moment_sync_is_priced_for_every_schedule_and_an_async_recipe_keeps_it(tmp_path):
    (tmp_path / "c.yaml").write_text(LAN_GPUS_YAML)
    cluster = load_cluster(str(tmp_path / "c.yaml"))
    compute = [0.1, 0.1 * 312 / 65]
    recipe = choose_local_steps(cluster, TINY, np.array([[0, 1]]), compute, total_steps=600, sync_moments=True,
                                asynchronous=True)
    assert recipe.sync_moments and set(recipe.local_steps_step_s) == {"equal", "adaptive"}  # adaptive takes moments
    plain = async_recipe(cluster, TINY, np.array([[0, 1]]), compute, 10)
    moments = async_recipe(cluster, TINY, np.array([[0, 1]]), compute, 10, sync_moments=True)
    assert moments.sync_moments and moments.runtime_settings()["optim"]["sync_moments"] is True
    # the round trip's bytes double (parameters and second moments), its latencies do not
    latency = float(cluster.latency_s[0, 1] + cluster.latency_s[1, 0])
    assert moments.sync_s - latency == pytest.approx(2 * (plain.sync_s - latency), rel=1e-9)


def test_a_pipeline_waits_for_its_slowest_stages_round_trip_and_each_server_sends_its_stage():
    near, far = _links(0.01, 1e9), _links(0.2, 1e9)
    price = async_outer_price([1.0, 2.0], 2, [1e6, 1e6], [near, far], staleness_bound=8)
    assert price.round_trip_s == pytest.approx((0.0, 0.4 + 2 * 8e6 / 1e9))  # the far stage's, not the sum
    whole = async_outer_price([1.0, 2.0], 2, 2e6, far, staleness_bound=8)
    assert whole.round_trip_s[1] - price.round_trip_s[1] == pytest.approx(2 * 8e6 / 1e9)  # half the bytes each
    with pytest.raises(AsyncPriceError, match="2 stages' model bytes but 1 stages' links"):
        async_outer_price([1.0, 2.0], 2, [1e6, 1e6], [near], staleness_bound=8)


def test_fragments_add_a_latency_pair_each_and_save_no_bytes():
    one = async_outer_price([1.0, 2.0], 2, 1e6, _links(0.05, 1e9), staleness_bound=8)
    four = async_outer_price([1.0, 2.0], 2, 1e6, _links(0.05, 1e9), staleness_bound=8, fragments=4)
    assert four.round_trip_s[1] - one.round_trip_s[1] == pytest.approx(3 * 0.1)
    with pytest.raises(AsyncPriceError, match="fragments"):
        async_outer_price([1.0, 2.0], 2, 1e6, _links(0.05, 1e9), staleness_bound=8, fragments=0)


def test_the_default_full_weight_charges_no_staleness():
    price = async_outer_price([1.0, 4.0], 2, 1e6, _links(0.05, 1e9), staleness_bound=8)
    assert min(price.staleness) > 0 and price.staleness_factor == 1.0 and price.charged_step_s == price.step_s
