"""The five network scenarios of Yuan et al., "Decentralized Training of Foundation Models in
Heterogeneous Environments", NeurIPS 2022 (arXiv:2206.01288; code: DS3Lab/DT-FM,
scheduler/heuristic_evolutionary_solver/config.py), as presets of 64 V100 GPUs each.

Figures come from `data/yuan2022_networks.yaml` (a copy of the repository's shared data file):
one-way latency in ms and bandwidth in Gbit/s, measured by the authors between AWS regions.
- yuan-datacenter: 8 instances x 8 GPUs; 100 Gbit/s inside an instance, 3.125 Gbit/s between, 0 ms.
- yuan-spot: 8 spot instances x 4 GPUs (100 Gbit/s inside) + 32 standalone GPUs; 1.25 Gbit/s
  between any two instances (the standalone GPUs form one region whose inside link is that figure).
- yuan-multi-universities: 32 GPUs in Ohio + 32 in Virginia; 5 Gbit/s, 1 ms inside; 1.12 Gbit/s, 11 ms between.
- yuan-regional: 16 GPUs in each of Virginia, Oregon, California, Ohio; 2 Gbit/s, 10 ms inside.
- yuan-worldwide: 8 GPUs in each of Oregon, Virginia, Ohio, Tokyo, Seoul, London, Frankfurt, Ireland;
  2 Gbit/s, 10 ms inside a city, measured city-pair figures between.
Their job (GPT-3 XL, 1.3B, 24 layers, hidden 2048, sequence 2048, global batch 1024 = 2 accumulation
steps x 64 x 8 replicas, 8 stages x 8 replicas; DT-FM scripts/local_scripts/gpt3_xl_pp8_dp8.sh) is
the `gpt-1.3b-seed` job preset: plan it with `--stages 8 --replicas 8`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from importlib import resources

import numpy as np
import yaml

from geotrain.cluster.errors import ClusterError
from geotrain.cluster.generators import region_cluster
from geotrain.cluster.model import Cluster

GPU = "V100"
DATA_FILE = "yuan2022_networks.yaml"


@lru_cache(maxsize=1)
def _data_text() -> str:
    return resources.files("geotrain.cluster").joinpath("data", DATA_FILE).read_text()


def yuan2022_data() -> dict:
    """The parsed data file (a fresh copy on every call)."""
    return yaml.safe_load(_data_text())


def _pair(table: dict, a: str, b: str) -> tuple[float, float]:
    """(latency ms, bandwidth Gbit/s) of a city pair, in either order."""
    for key in (f"{a}-{b}", f"{b}-{a}"):
        if key in table:
            ms, gbps = table[key]
            return float(ms), float(gbps)
    raise ClusterError(f"{DATA_FILE}: no link figures for {a}-{b}")


def _regions(name: str, scenario: dict, table: dict) -> Cluster:
    cities = list(scenario["regions"])
    sizes = [int(scenario["regions"][c]) for c in cities]
    intra = scenario["intra"]
    G = len(cities)
    bandwidth = np.full((G, G), float(intra["gbps"]))
    latency = np.full((G, G), float(intra["ms"]))
    for i in range(G):
        for j in range(i + 1, G):
            ms, gbps = _pair(table, cities[i], cities[j])
            latency[i, j] = latency[j, i] = ms
            bandwidth[i, j] = bandwidth[j, i] = gbps
    return region_cluster(name, cities, sizes, bandwidth, latency, GPU)


def _instances(name: str, scenario: dict, per_instance: int, instances: int) -> Cluster:
    """`instances` instances of `per_instance` GPUs; any GPUs left over are standalone (one region)."""
    inside, between = scenario["intra_instance"], scenario["inter_instance"]
    sizes = [per_instance] * instances
    names = [f"instance{i}" for i in range(instances)]
    leftover = int(scenario["devices"]) - per_instance * instances
    if leftover:
        sizes.append(leftover)
        names.append("standalone")
    G = len(sizes)
    bandwidth = np.full((G, G), float(between["gbps"]))
    latency = np.full((G, G), float(between["ms"]))
    np.fill_diagonal(bandwidth[:instances, :instances], float(inside["gbps"]))
    np.fill_diagonal(latency[:instances, :instances], float(inside["ms"]))
    return region_cluster(name, names, sizes, bandwidth, latency, GPU)


def yuan_datacenter() -> Cluster:
    """Case 1: on-demand datacenter, 8 instances x 8 V100 (Yuan et al. 2022)."""
    return _instances("yuan-datacenter", yuan2022_data()["scenarios"]["datacenter"], 8, 8)


def yuan_spot() -> Cluster:
    """Case 2: spot instances, 8 x 4 V100 plus 32 standalone V100 (Yuan et al. 2022)."""
    return _instances("yuan-spot", yuan2022_data()["scenarios"]["spot"], 4, 8)


def yuan_multi_universities() -> Cluster:
    """Case 3: 32 V100 in Ohio, 32 in Virginia (Yuan et al. 2022)."""
    data = yuan2022_data()
    return _regions("yuan-multi-universities", data["scenarios"]["multi_universities"],
                    data["scenarios"]["multi_universities"]["links"])


def yuan_regional() -> Cluster:
    """Case 4: 16 V100 in each of four US regions (Yuan et al. 2022)."""
    data = yuan2022_data()
    return _regions("yuan-regional", data["scenarios"]["regional"], data["scenarios"]["regional"]["links"])


def yuan_worldwide() -> Cluster:
    """Case 5: 8 V100 in each of eight cities on three continents (Yuan et al. 2022)."""
    data = yuan2022_data()
    return _regions("yuan-worldwide", data["scenarios"]["worldwide"], data["links"])


YUAN2022_PRESETS: dict[str, Callable[[], Cluster]] = {
    "yuan-datacenter": yuan_datacenter,
    "yuan-spot": yuan_spot,
    "yuan-multi-universities": yuan_multi_universities,
    "yuan-regional": yuan_regional,
    "yuan-worldwide": yuan_worldwide,
}
