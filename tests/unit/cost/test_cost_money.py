"""Money per step: GPU-hours and the bytes leaving each region, against a hand count."""

import numpy as np
import pytest

from geotrain.cluster import region_cluster
from geotrain.cluster.prices import Prices
from geotrain.cost.money import egress_bytes, exchange_pair_bytes, star_bytes, step_money


def two_sites():
    """Site a: 2 devices (A100), site b: 2 devices (T4)."""
    gbps = np.array([[100.0, 1.0], [1.0, 100.0]])
    ms = np.array([[0.1, 50.0], [50.0, 0.1]])
    cluster = region_cluster("ab", ["a", "b"], [2, 2], gbps, ms, gpus=["A100", "T4"])
    import dataclasses

    return dataclasses.replace(cluster, prices=Prices({"A100": 2.0, "T4": 0.5}, (0.1, 0.2)))


def test_exchange_pair_bytes_scatter_gather_and_gathered():
    assert exchange_pair_bytes(1000.0, 4, gathered=False) == 500.0  # 2 c / n to each peer
    assert exchange_pair_bytes(1000.0, 4, gathered=True, period=5) == 200.0  # the payload to each peer, every 5 steps
    assert exchange_pair_bytes(1000.0, 1, gathered=False) == 0.0


def test_egress_counts_what_leaves_each_region_by_hand():
    cluster = two_sites()
    # one stage, replicas on devices 0 (a), 1 (a), 2 (b): a sends 2 members x 1 peer in b, b sends 1 x 2 in a
    np.testing.assert_allclose(egress_bytes(cluster, [[0, 1, 2]], dp_pair_bytes=10.0), [20.0, 20.0])
    # two stages, one replica: stage 0 on a, stage 1 on b: activations a -> b and gradients b -> a
    np.testing.assert_allclose(egress_bytes(cluster, [[0], [2]], dp_pair_bytes=10.0, pp_bytes=7.0), [7.0, 7.0])
    # asynchronous: replicas 1 (a) and 2 (b) with the server on device 0 (a): only b's round trip crosses
    np.testing.assert_allclose(star_bytes(cluster, [[0, 1, 2]], model_bytes=100.0, period=4), [25.0, 25.0])


def test_step_money_prices_the_devices_used_and_the_egress():
    cluster = two_sites()
    money = step_money(cluster, [[0, 2]], step_s=36.0, egress=np.array([1e9, 2e9]))
    assert money.gpu_usd == pytest.approx((2.0 + 0.5) * 36.0 / 3600)
    assert money.egress_usd == pytest.approx(1 * 0.1 + 2 * 0.2)
    assert money.usd_per_hour == pytest.approx(money.usd * 100)
    doc = money.to_json(cluster.region_names, steps=10)
    assert doc["usd_per_run"] == pytest.approx(10 * money.usd) and doc["egress_gb_per_step"] == {"a": 1.0, "b": 2.0}
