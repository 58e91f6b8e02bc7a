"""Read and write cluster files (YAML or JSON) in the compact region form and the dense form.

Compact form (every region pair appears exactly once in `links`)::

    name: geo-4x8
    regions:
      - {name: oregon, devices: 8, gpu: V100, intra: {gbps: 10, ms: 0.1}}
      - {name: virginia, devices: 8, host: gpu-box-7, nic_gbps: 25}
      - {name: ohio, devices: 4, gpu: [A100, A100, T4, T4]}
    links:
      - {between: [oregon, virginia], gbps: 1.12, ms: 67}
    defaults: {intra: {gbps: 10, ms: 0.1}, link: {ms: 50}, gpu: V100, nic_gbps: 100}

A region's `gpu` is one type for all its devices, or a list of one type per device (its length the
region's `devices`). GPU types are checked against the table of geotrain.cluster.gpus when the file is
loaded (`unknown`, the default, names none).

Dense form: `devices: [{name, region, gpu, host, gpu_index, nic_gbps, memory_gib}]`, `bandwidth_gbps: NxN`,
`latency_ms: NxN` (diagonal ignored).

Where devices run (both forms optional): `host` names a device's machine (a region's `host`: all its
devices), `gpu_index` (dense form) its GPU on that machine (`gpu` stays the GPU type), `nic_gbps` its
NIC in Gbit/s, one per device, shared by all it sends at once (a region's or the default's: each of
its devices has one that fast). Left out: no host (one machine), no GPU index, unlimited NIC.
`memory_gib` (a region's, a device's or the default's) caps the GPU memory a job may use on each device, in GiB,
where it is less than the GPU type's datasheet (a MIG slice, a GPU shared with other jobs); the planner's memory
checks use it instead of the datasheet's.

Prices (both forms, optional; cluster/prices.py): `prices: {gpu_hour: {TYPE: USD, ...}, egress_per_gb: USD or
{REGION: USD, default: USD}}`, a price per GPU-hour for every GPU type and per GB leaving each region.

Every error names the source, the key path and the offending value (cut to 80 characters). Files
are read by geotrain.yaml_text (size cap, UTF-8, YAML 1.2 numbers, no aliases, no duplicate keys);
values must lie within the limits of cluster/model.py (devices, bandwidth, latency).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from geotrain.cluster.errors import ClusterFileError
from geotrain.cluster.gpus import UNKNOWN_GPU, UnknownGpuError, check_gpu_type
from geotrain.cluster.model import MAX_DEVICES, MAX_GBPS, MAX_MEMORY_GIB, MAX_MS, MIN_GBPS, Cluster
from geotrain.cluster.prices import MAX_USD, Prices
from geotrain.errors import shown
from geotrain.yaml_text import (MAX_YAML_BYTES, MAX_YAML_NODES, document_errors_as, dump_yaml_text, located,
                                parse_document, read_text_file)

_COMPACT_KEYS = {"name", "regions", "links", "defaults", "prices"}
_DENSE_KEYS = {"name", "devices", "bandwidth_gbps", "latency_ms", "prices"}
_PRICE_KEYS = {"gpu_hour", "egress_per_gb"}
_REGION_KEYS = {"name", "devices", "gpu", "intra", "host", "nic_gbps", "memory_gib"}
_DEVICE_KEYS = {"name", "region", "gpu", "host", "gpu_index", "nic_gbps", "memory_gib"}
_LINK_KEYS = {"between", "gbps", "ms"}
_DEFAULT_KEYS = {"intra", "link", "gpu", "nic_gbps", "memory_gib"}
MAX_GPU_INDEX = 4095
_FIGURE_KEYS = {"gbps", "ms"}
DEFAULT_GPU = UNKNOWN_GPU


class _Reader:
    """Validates values of one parsed document; every failure raises ClusterFileError."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, problem: str) -> ClusterFileError:
        return ClusterFileError(located(self.source, path, problem))

    def mapping(self, value: Any, path: str, allowed: set[str]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a mapping, got {shown(value)}")
        unknown = sorted(set(map(str, value)) - allowed)
        if unknown:
            raise self.fail(path, f"unknown key {shown(unknown[0])} (allowed: {', '.join(sorted(allowed))})")
        return value

    def sequence(self, value: Any, path: str, min_len: int = 0) -> list:
        if not isinstance(value, list):
            raise self.fail(path, f"must be a list, got {shown(value)}")
        if len(value) < min_len:
            raise self.fail(path, f"must have at least {min_len} entries, got {len(value)}")
        return value

    def number(self, value: Any, path: str, *, positive: bool = False) -> float:
        """A bandwidth (positive: Gbit/s in MIN_GBPS..MAX_GBPS) or a latency (ms in 0..MAX_MS)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(path, f"must be a number, got {shown(value)}")
        try:
            number = float(value)
        except OverflowError:  # an int beyond float range
            number = math.inf
        if not math.isfinite(number):
            raise self.fail(path, f"must be finite, got {shown(value)}")
        if positive and number <= 0:
            raise self.fail(path, f"must be > 0, got {shown(value)}")
        if not positive and number < 0:
            raise self.fail(path, f"must be >= 0, got {shown(value)}")
        low, high, unit = (MIN_GBPS, MAX_GBPS, "Gbit/s") if positive else (0.0, MAX_MS, "ms")
        if not low <= number <= high:
            raise self.fail(path, f"must be in {low:g}..{high:g} {unit}, got {shown(value)}")
        return number

    def count(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(path, f"must be an integer >= 1, got {shown(value)}")
        if value > MAX_DEVICES:
            raise self.fail(path, f"must be at most {MAX_DEVICES:,} (the device limit), got {shown(value)}")
        return value

    def gpu_index(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPU_INDEX:
            raise self.fail(path, f"must be an integer in 0..{MAX_GPU_INDEX}, got {shown(value)}")
        return value

    def optional(self, entry: dict, key: str, path: str, check: Any, fallback: Any = None) -> Any:
        """`check(entry[key], path.key)` when the key is given, else `fallback` (already checked)."""
        return check(entry[key], f"{path}.{key}") if key in entry else fallback

    def nic(self, value: Any, path: str) -> float:
        """A NIC in Gbit/s (MIN_GBPS..MAX_GBPS)."""
        return self.number(value, path, positive=True)

    def memory(self, value: Any, path: str) -> float:
        """GPU memory a job may use, in GiB: a number in (0, MAX_MEMORY_GIB]."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_MEMORY_GIB:
            raise self.fail(path, f"must be a number of GiB in (0, {MAX_MEMORY_GIB:g}], got {shown(value)}")
        return float(value)

    def text(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(path, f"must be a non-empty string, got {shown(value)}")
        return value

    def gpu(self, value: Any, path: str) -> str:
        """A GPU type of the table (geotrain.cluster.gpus) or `unknown`."""
        name = self.text(value, path)
        try:
            check_gpu_type(name)
        except UnknownGpuError as exc:
            raise self.fail(path, str(exc)) from None
        return name

    def region_gpus(self, value: Any, path: str, size: int) -> list[str]:
        """A region's `gpu`: one type for its `size` devices, or a list of exactly one type per device."""
        if not isinstance(value, list):
            return [self.gpu(value, path)] * size
        if len(value) != size:
            raise self.fail(path, f"must list one GPU type per device: {size} (the region's devices), "
                                  f"got {len(value)}")
        return [self.gpu(entry, f"{path}[{k}]") for k, entry in enumerate(value)]

    def figure(self, value: Any, path: str, fallback: dict, fallback_path: str) -> tuple[float, float]:
        """A {gbps, ms} mapping; missing fields come from `fallback` (the defaults)."""
        given = self.mapping(value if value is not None else {}, path, _FIGURE_KEYS)
        merged = {**fallback, **given}
        for key in ("gbps", "ms"):
            if key not in merged:
                raise self.fail(f"{path}.{key}", f"missing (give it here or in {fallback_path})")
        gbps_path = f"{path}.gbps" if "gbps" in given else f"{fallback_path}.gbps"
        ms_path = f"{path}.ms" if "ms" in given else f"{fallback_path}.ms"
        return self.number(merged["gbps"], gbps_path, positive=True), self.number(merged["ms"], ms_path)


def cluster_from_dict(doc: Any, source: str = "<cluster>") -> Cluster:
    """Build a Cluster from a parsed document in either form."""
    reader = _Reader(source)
    if not isinstance(doc, dict):
        raise reader.fail("", f"top level must be a mapping, got {type(doc).__name__}")
    if "regions" in doc and "devices" in doc:
        raise reader.fail("", "give either 'regions' (compact form) or 'devices' (dense form), not both")
    if "regions" in doc:
        cluster = _compact(reader, reader.mapping(doc, "", _COMPACT_KEYS))
    elif "devices" in doc:
        cluster = _dense(reader, reader.mapping(doc, "", _DENSE_KEYS))
    else:
        raise reader.fail("", "missing 'regions' (compact form) or 'devices' (dense form)")
    if doc.get("prices") is None:
        return cluster
    return dataclasses.replace(cluster, prices=_prices(reader, doc["prices"], cluster))


def _prices(reader: _Reader, value: Any, cluster: Cluster) -> Prices:
    """The file's `prices` (cluster/prices.py): a price per GPU-hour for every GPU type, and per GB leaving each
    region (one number for all, or by region name with an optional `default`)."""
    doc = reader.mapping(value, "prices", _PRICE_KEYS)
    hours = reader.mapping(doc.get("gpu_hour", {}), "prices.gpu_hour", set(cluster.gpus))
    gpu_hour = {gpu: _usd(reader, price, f"prices.gpu_hour.{gpu}") for gpu, price in hours.items()}
    missing = sorted(set(cluster.gpus) - set(gpu_hour))
    if missing:
        raise reader.fail("prices.gpu_hour", f"needs a price for every GPU type of the cluster; missing: "
                                             f"{', '.join(missing)}")
    egress = doc.get("egress_per_gb", 0.0)
    if isinstance(egress, dict):
        names = set(cluster.region_names) | {"default"}
        egress = reader.mapping(egress, "prices.egress_per_gb", names)
        prices = {name: _usd(reader, price, f"prices.egress_per_gb.{name}") for name, price in egress.items()}
        unpriced = [name for name in cluster.region_names if name not in prices and "default" not in prices]
        if unpriced:
            raise reader.fail("prices.egress_per_gb", f"no price for {', '.join(unpriced)} (give them, or a default)")
        per_region = tuple(prices.get(name, prices.get("default", 0.0)) for name in cluster.region_names)
    else:
        per_region = (_usd(reader, egress, "prices.egress_per_gb"),) * cluster.n_regions
    return Prices(gpu_hour, per_region)


def _usd(reader: _Reader, value: Any, path: str) -> float:
    """A price in USD: a finite number in 0..MAX_USD."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= float(value) <= MAX_USD:
        raise reader.fail(path, f"must be a number of USD in 0..{MAX_USD:g}, got {shown(value)}")
    return float(value)


def _compact(reader: _Reader, doc: dict) -> Cluster:
    name = reader.text(doc.get("name", Path(reader.source).stem), "name")
    defaults = reader.mapping(doc.get("defaults", {}), "defaults", _DEFAULT_KEYS)
    intra_default = reader.mapping(defaults.get("intra", {}), "defaults.intra", _FIGURE_KEYS)
    link_default = reader.mapping(defaults.get("link", {}), "defaults.link", _FIGURE_KEYS)
    default_gpu = reader.gpu(defaults.get("gpu", DEFAULT_GPU), "defaults.gpu")
    default_nic = reader.optional(defaults, "nic_gbps", "defaults", reader.nic, math.inf)
    default_memory = reader.optional(defaults, "memory_gib", "defaults", reader.memory, math.nan)

    regions = reader.sequence(doc["regions"], "regions", min_len=1)
    names: list[str] = []
    sizes: list[int] = []
    gpus: list[str] = []
    intra: list[tuple[float, float]] = []
    hosts: list[str | None] = []
    nics: list[float] = []
    memory: list[float] = []
    for i, entry in enumerate(regions):
        path = f"regions[{i}]"
        entry = reader.mapping(entry, path, _REGION_KEYS)
        if "name" not in entry:
            raise reader.fail(f"{path}.name", "missing")
        region = reader.text(entry["name"], f"{path}.name")
        if region in names:
            raise reader.fail(f"{path}.name", f"duplicate region name {shown(region)}")
        if "devices" not in entry:
            raise reader.fail(f"{path}.devices", "missing")
        size = reader.count(entry["devices"], f"{path}.devices")
        if sum(sizes) + size > MAX_DEVICES:
            raise reader.fail(f"{path}.devices", f"the regions so far hold {sum(sizes) + size:,} devices, "
                                                 f"more than the limit of {MAX_DEVICES:,}")
        gpus.extend(reader.region_gpus(entry.get("gpu", default_gpu), f"{path}.gpu", size))
        hosts.append(reader.optional(entry, "host", path, reader.text))
        nics.append(reader.optional(entry, "nic_gbps", path, reader.nic, default_nic))
        memory.append(reader.optional(entry, "memory_gib", path, reader.memory, default_memory))
        if size > 1 or entry.get("intra") is not None:
            # a one-device region has no internal pair, but a figure given for it is checked all the same
            intra.append(reader.figure(entry.get("intra"), f"{path}.intra", intra_default, "defaults.intra"))
        else:
            intra.append((1.0, 0.0))  # never used: a one-device region has no internal pair
        names.append(region)
        sizes.append(size)

    n_regions = len(names)
    inter: dict[tuple[int, int], tuple[float, float]] = {}
    links = reader.sequence(doc.get("links", []), "links")
    for i, entry in enumerate(links):
        path = f"links[{i}]"
        entry = reader.mapping(entry, path, _LINK_KEYS)
        pair = reader.sequence(entry.get("between"), f"{path}.between")
        if len(pair) != 2:
            raise reader.fail(f"{path}.between", f"must name exactly two regions, got {shown(pair)}")
        ends = []
        for j, region in enumerate(pair):
            if region not in names:
                known = shown(", ".join(names))[1:-1]
                raise reader.fail(f"{path}.between[{j}]", f"unknown region {shown(region)} (known: {known})")
            ends.append(names.index(region))
        if ends[0] == ends[1]:
            raise reader.fail(f"{path}.between", f"links a region to itself ({shown(pair[0])}); use regions[].intra")
        key = (min(ends), max(ends))
        if key in inter:
            raise reader.fail(f"{path}.between", f"duplicate link between {shown(pair[0])} and {shown(pair[1])}")
        figures = {k: entry[k] for k in _FIGURE_KEYS if k in entry}
        inter[key] = reader.figure(figures, path, link_default, "defaults.link")
    missing = [(a, b) for a in range(n_regions) for b in range(a + 1, n_regions) if (a, b) not in inter]
    if missing:
        a, b = missing[0]
        raise reader.fail("links", f"missing link between {shown(names[a])} and {shown(names[b])} "
                                   f"({len(missing)} pair(s) missing)")

    region_of = np.repeat(np.arange(n_regions), sizes)
    bandwidth = np.empty((n_regions, n_regions))
    latency = np.empty((n_regions, n_regions))
    for r in range(n_regions):
        bandwidth[r, r], latency[r, r] = intra[r]
    for (a, b), (gbps, ms) in inter.items():
        bandwidth[a, b] = bandwidth[b, a] = gbps
        latency[a, b] = latency[b, a] = ms
    device_names = tuple(f"{names[r]}-{k}" for r, size in enumerate(sizes) for k in range(size))
    return Cluster(
        name=name,
        device_names=device_names,
        region_names=tuple(names),
        region_of=region_of,
        gpus=tuple(gpus),
        bandwidth_gbps=bandwidth[np.ix_(region_of, region_of)],
        latency_ms=latency[np.ix_(region_of, region_of)],
        hosts=tuple(hosts[r] for r in region_of.tolist()),
        nic_gbps=np.repeat(np.array(nics), sizes),
        memory_gib=np.repeat(np.array(memory), sizes),
    )


def _dense(reader: _Reader, doc: dict) -> Cluster:
    name = reader.text(doc.get("name", Path(reader.source).stem), "name")
    devices = reader.sequence(doc["devices"], "devices", min_len=1)
    if len(devices) > MAX_DEVICES:
        raise reader.fail("devices", f"{len(devices):,} devices exceed the limit of {MAX_DEVICES:,}")
    device_names: list[str] = []
    region_names: list[str] = []
    region_of: list[int] = []
    gpus: list[str] = []
    hosts: list[str | None] = []
    gpu_index: list[int | None] = []
    nics: list[float] = []
    memory: list[float] = []
    placed: dict[tuple[str | None, int | None], str] = {}
    for i, entry in enumerate(devices):
        path = f"devices[{i}]"
        entry = reader.mapping(entry, path, _DEVICE_KEYS)
        device = reader.text(entry.get("name", f"d{i}"), f"{path}.name")
        if device in device_names:
            raise reader.fail(f"{path}.name", f"duplicate device name {shown(device)}")
        region = reader.text(entry.get("region", "default"), f"{path}.region")
        if region not in region_names:
            region_names.append(region)
        device_names.append(device)
        region_of.append(region_names.index(region))
        gpus.append(reader.gpu(entry.get("gpu", DEFAULT_GPU), f"{path}.gpu"))
        hosts.append(reader.optional(entry, "host", path, reader.text))
        gpu_index.append(reader.optional(entry, "gpu_index", path, reader.gpu_index))
        nics.append(reader.optional(entry, "nic_gbps", path, reader.nic, math.inf))
        memory.append(reader.optional(entry, "memory_gib", path, reader.memory, math.nan))
        place = (hosts[-1], gpu_index[-1])
        if None not in place and place in placed:
            raise reader.fail(f"{path}.gpu_index", f"GPU {place[1]} of host {shown(place[0])} is already device "
                                                   f"{shown(placed[place])}")
        placed[place] = device
    n = len(device_names)
    matrices = {}
    for key, positive in (("bandwidth_gbps", True), ("latency_ms", False)):
        if key not in doc:
            raise reader.fail(key, "missing")
        rows = reader.sequence(doc[key], key)
        if len(rows) != n:
            raise reader.fail(key, f"must have {n} rows (one per device), got {len(rows)}")
        matrix = np.zeros((n, n))
        for i, row in enumerate(rows):
            row = reader.sequence(row, f"{key}[{i}]")
            if len(row) != n:
                raise reader.fail(f"{key}[{i}]", f"must have {n} entries (square matrix), got {len(row)}")
            for j, value in enumerate(row):
                if i != j:
                    matrix[i, j] = reader.number(value, f"{key}[{i}][{j}]", positive=positive)
        asym = np.argwhere(matrix != matrix.T)
        if len(asym):
            i, j = asym[0]
            raise reader.fail(f"{key}[{i}][{j}]", f"matrix must be symmetric: {float(matrix[i, j])!r} != {key}[{j}][{i}] = {float(matrix[j, i])!r}")
        matrices[key] = matrix
    return Cluster(
        name=name,
        device_names=tuple(device_names),
        region_names=tuple(region_names),
        region_of=np.array(region_of),
        gpus=tuple(gpus),
        bandwidth_gbps=matrices["bandwidth_gbps"],
        latency_ms=matrices["latency_ms"],
        hosts=tuple(hosts),
        gpu_index=tuple(gpu_index),
        nic_gbps=np.array(nics),
        memory_gib=np.array(memory),
    )


def parse_cluster_text(text: str, source: str = "<cluster>") -> Cluster:
    """Parse YAML or JSON text (JSON is valid YAML) into a Cluster."""
    with document_errors_as(ClusterFileError):
        doc = parse_document(text, source)
    return cluster_from_dict(doc, source)


def load_cluster_file(path: str | Path) -> Cluster:
    """Load a cluster from a YAML or JSON file."""
    with document_errors_as(ClusterFileError):
        text = read_text_file(path)
    return parse_cluster_text(text, str(path))


def cluster_to_dict(cluster: Cluster, form: str = "auto") -> dict:
    """Serialise to the compact form when links depend only on regions ("auto"), else the dense form."""
    if form not in ("auto", "compact", "dense"):
        raise ValueError(f"form must be 'auto', 'compact' or 'dense', got {form!r}")
    # hosts and NICs can be given per region only when uniform inside each region; GPU indices never
    per_region = all(len({cluster.hosts[d] for d in cluster.devices_in_region(r)}) == 1
                     and len({float(cluster.nic_gbps[d]) for d in cluster.devices_in_region(r)}) == 1
                     and len({str(float(cluster.memory_gib[d])) for d in cluster.devices_in_region(r)}) == 1
                     for r in range(cluster.n_regions)) and all(g is None for g in cluster.gpu_index)
    # the compact form regenerates device names as "<region>-<k>": only use it when that is lossless
    generated = tuple(f"{cluster.region_names[r]}-{k}" for r, size in enumerate(cluster.region_sizes()) for k in range(size))
    in_region_order = bool(np.all(np.diff(cluster.region_of) >= 0))
    compact_ok = cluster.is_region_uniform() and per_region and in_region_order and cluster.device_names == generated
    if form == "compact" and not compact_ok:
        raise ValueError(f"cluster {shown(cluster.name)} has per-device links, hosts or NICs: use the dense form")
    if form == "dense" or not compact_ok:
        return {
            "name": cluster.name,
            "devices": [{"name": d, "region": cluster.region_names[r], "gpu": g, **_placement(cluster, i)}
                        for i, (d, r, g) in enumerate(zip(cluster.device_names, cluster.region_of.tolist(), cluster.gpus))],
            "bandwidth_gbps": cluster.bandwidth_gbps.tolist(),
            "latency_ms": cluster.latency_ms.tolist(),
            **_prices_entry(cluster),
        }
    regions = []
    for r, name in enumerate(cluster.region_names):
        region_gpus = [cluster.gpus[int(d)] for d in cluster.devices_in_region(r)]
        entry: dict[str, Any] = {"name": name, "devices": int(cluster.region_sizes()[r]),
                                 "gpu": region_gpus[0] if len(set(region_gpus)) == 1 else region_gpus,
                                 **_placement(cluster, int(cluster.devices_in_region(r)[0]))}
        link = cluster.region_link(r, r)
        if link is not None:
            entry["intra"] = {"gbps": link.gbps, "ms": link.ms}
        regions.append(entry)
    links = []
    for a in range(cluster.n_regions):
        for b in range(a + 1, cluster.n_regions):
            link = cluster.region_link(a, b)
            links.append({"between": [cluster.region_names[a], cluster.region_names[b]], "gbps": link.gbps, "ms": link.ms})
    return {"name": cluster.name, "regions": regions, "links": links, **_prices_entry(cluster)}


def _prices_entry(cluster: Cluster) -> dict[str, Any]:
    """{"prices": ...} when the cluster has prices, else nothing."""
    return {} if cluster.prices is None else {"prices": cluster.prices.to_dict(cluster.region_names)}


def _placement(cluster: Cluster, device: int) -> dict[str, Any]:
    """The host, GPU index, NIC and memory keys of a device entry, only those given (finite NIC, memory limit)."""
    entry: dict[str, Any] = {}
    if cluster.hosts[device] is not None:
        entry["host"] = cluster.hosts[device]
    if cluster.gpu_index[device] is not None:
        entry["gpu_index"] = cluster.gpu_index[device]
    if math.isfinite(cluster.nic_gbps[device]):
        entry["nic_gbps"] = float(cluster.nic_gbps[device])
    if not math.isnan(cluster.memory_gib[device]):
        entry["memory_gib"] = float(cluster.memory_gib[device])
    return entry


def save_cluster_file(cluster: Cluster, path: str | Path, form: str = "auto") -> None:
    """Write a cluster as JSON (.json) or YAML (anything else). A document too large for the YAML
    reader's budget (MAX_YAML_NODES values, MAX_YAML_BYTES) is written as JSON text instead, which is
    valid YAML and reads fast, so that every saved cluster loads again."""
    path = Path(path)
    doc = cluster_to_dict(cluster, form)
    if path.suffix.lower() != ".json" and _value_count(doc) <= MAX_YAML_NODES:
        text = dump_yaml_text(doc)
        if len(text.encode()) <= MAX_YAML_BYTES:
            path.write_text(text)
            return
    path.write_text(json.dumps(doc, indent=2) + "\n")


def _value_count(doc: Any) -> int:
    """Nodes of a document as the YAML reader counts them (every mapping, list, key and scalar)."""
    count, stack = 0, [doc]
    while stack:
        value = stack.pop()
        count += 1
        if isinstance(value, dict):
            count += len(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return count
