"""Prices in a cluster file: read, written back, carried to a cluster of some of its devices; bad ones in one line."""

import pytest

from geotrain.cluster import ClusterFileError
from geotrain.cluster.io import cluster_to_dict, parse_cluster_text
from geotrain.cluster.membership import restrict_cluster

BASE = """name: priced
regions:
  - {name: tokyo, devices: 2, gpu: H100}
  - {name: saopaulo, devices: 2, gpu: [L4, T4]}
links:
  - {between: [tokyo, saopaulo], gbps: 0.2, ms: 260}
defaults: {intra: {gbps: 100, ms: 0.1}}
"""


def test_prices_are_read_per_gpu_type_and_region_and_written_back():
    cluster = parse_cluster_text(BASE + "prices: {gpu_hour: {H100: 4, L4: 0.7, T4: 0.35}, "
                                        "egress_per_gb: {default: 0.09, saopaulo: 0.15}}\n")
    assert dict(cluster.prices.gpu_hour_usd) == {"H100": 4.0, "L4": 0.7, "T4": 0.35}
    assert cluster.prices.egress_usd_per_gb == (0.09, 0.15)
    again = parse_cluster_text(str(cluster_to_dict(cluster)).replace("'", '"'))
    assert again.prices == cluster.prices
    assert restrict_cluster(cluster, [2, 3]).prices.egress_usd_per_gb == (0.15,)  # saopaulo only
    assert parse_cluster_text(BASE + "prices: {gpu_hour: {H100: 4, L4: 1, T4: 1}, egress_per_gb: 0.05}\n") \
        .prices.egress_usd_per_gb == (0.05, 0.05)
    assert parse_cluster_text(BASE).prices is None


@pytest.mark.parametrize("prices, where", [
    ("{gpu_hour: {H100: 4, L4: 1}}", "missing: T4"),
    ("{gpu_hour: {H100: 4, L4: 1, T4: 1, V100: 1}}", "unknown key 'V100'"),
    ("{gpu_hour: {H100: -1, L4: 1, T4: 1}}", "prices.gpu_hour.H100"),
    ("{gpu_hour: {H100: 1, L4: 1, T4: 1}, egress_per_gb: {tokyo: 0.1}}", "no price for saopaulo"),
    ("{gpu_hour: {H100: 1, L4: 1, T4: 1}, egress_per_gb: {paris: 0.1}}", "unknown key 'paris'"),
    ("{gpu_hour: {H100: 1, L4: 1, T4: 1}, egress_per_gb: .inf}", "prices.egress_per_gb"),
    ("{gpu_hour: {H100: 1, L4: 1, T4: 1}, egress: 1}", "unknown key 'egress'"),
])
def test_a_bad_price_is_one_line_naming_its_key(prices, where):
    with pytest.raises(ClusterFileError) as refused:
        parse_cluster_text(BASE + f"prices: {prices}\n")
    assert where in str(refused.value) and "\n" not in str(refused.value)
