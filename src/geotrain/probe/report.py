"""Turn measurements into a cluster file (the dense form that `geotrain plan --cluster` reads).

The file holds the symmetric matrices the planner needs (bandwidth: mean of the two directions) and
device names and regions; the date, the probe settings, how regions were found, and the raw
measurements (directed bandwidth, transfer sizes, round-trip spread) ride along as YAML comments,
because the cluster loader accepts no extra keys. `probe_record` holds the same as one JSON object.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime

import numpy as np
import yaml

from geotrain.cluster import Cluster, cluster_from_dict
from geotrain.probe.measure import Measurements, ProbeConfig
from geotrain.probe.regions import RegionSplit


def _significant(matrix: np.ndarray, digits: int = 4) -> list[list[float]]:
    return [[float(f"{value:.{digits}g}") for value in row] for row in np.asarray(matrix, dtype=float)]


def device_names(hosts: tuple[str, ...], local_ranks: tuple[int, ...]) -> list[str]:
    """`host-localrank`, or `host-r<rank>` when that is not unique (several namespaces of one host)."""
    names = [f"{host}-{local}" for host, local in zip(hosts, local_ranks)]
    if len(set(names)) == len(names):
        return names
    return [f"{host}-r{rank}" for rank, host in enumerate(hosts)]


def cluster_document(m: Measurements, split: RegionSplit, names: list[str], gpus: list[str], name: str) -> dict:
    """The dense-form cluster document (validated: it loads with the project's cluster loader)."""
    doc = {
        "name": name,
        "devices": [{"name": device, "region": f"r{region}", "gpu": gpu}
                    for device, region, gpu in zip(names, split.labels, gpus)],
        "bandwidth_gbps": _significant(m.bandwidth_gbps),
        "latency_ms": _significant(m.latency_ms),
    }
    cluster_from_dict(doc, f"<probe {name}>")
    return doc


def probe_record(m: Measurements, split: RegionSplit, config: ProbeConfig, date: datetime) -> dict:
    """Everything measured, for a JSON report or the file's comments."""
    return {
        "date": date.isoformat(timespec="seconds"),
        "settings": asdict(config),
        "regions": {"metric": split.metric, "cut": split.cut, "gap_ratio": split.ratio, "labels": list(split.labels)},
        "hosts": list(m.hosts),
        "latency_ms": _significant(m.latency_ms),
        "latency_min_ms": _significant(m.latency_min_ms),
        "rtt_ms_interquartile": _significant(m.rtt_ms_spread, 3),
        "bandwidth_gbps_directed": _significant(m.bandwidth_gbps_directed),
        "transfer_bytes": m.transfer_bytes.tolist(),
    }


def cluster_yaml(doc: dict, record: dict) -> str:
    """YAML text: a comment header (date, settings, region rule used, raw matrices), then `doc`."""
    regions = record["regions"]
    unit = {"latency": " ms", "bandwidth": " s/Gbit"}.get(regions["metric"], "")
    header = [
        f"measured by `geotrain probe` on {record['date']} ({len(record['hosts'])} processes)",
        f"settings: {json.dumps(record['settings'])}",
        f"regions: clustered on {regions['metric']} (cut {regions['cut']:.4g}{unit}, gap ratio "
        f"{regions['gap_ratio']:.3g}; latency: minimum RTT / 2); bandwidth_gbps = mean of both directions; "
        "latency_ms = median RTT / 2",
        "raw (row = sender, column = receiver):",
        *(f"  {key}: {json.dumps(record[key])}"
          for key in ("bandwidth_gbps_directed", "transfer_bytes", "latency_min_ms", "rtt_ms_interquartile", "hosts")),
    ]
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=160)
    return "".join(f"# {line}\n" for line in header) + body


def region_summary(cluster: Cluster) -> list[list[str]]:
    """Table rows: region pair, device pairs, mean bandwidth (Gbit/s), mean latency (ms)."""
    rows = []
    for a in range(cluster.n_regions):
        for b in range(a, cluster.n_regions):
            rows_a, rows_b = cluster.devices_in_region(a), cluster.devices_in_region(b)
            mask = np.ones((len(rows_a), len(rows_b)), dtype=bool)
            if a == b:
                mask &= ~np.eye(len(rows_a), dtype=bool)
            if not mask.any():
                continue
            bw = cluster.bandwidth_gbps[np.ix_(rows_a, rows_b)][mask]
            ms = cluster.latency_ms[np.ix_(rows_a, rows_b)][mask]
            label = (f"inside {cluster.region_names[a]}" if a == b
                     else f"{cluster.region_names[a]} <-> {cluster.region_names[b]}")
            rows.append([label, str(int(mask.sum())), f"{bw.mean():.3f}", f"{bw.min():.3f}", f"{ms.mean():.3f}"])
    return rows
