"""Which devices of a cluster are still live: `--exclude-devices IDS` or a `--membership FILE`.

A device is named as the cluster file names it (its name, e.g. `oregon-0`) or by its index
0..N-1 (a name wins where a name looks like an index). A membership file is a JSON or YAML list of
the live devices (names or indices), read under geotrain.yaml_text's rules:

    ["oregon-0", "virginia-0", "tokyo-0"]      # or, in YAML: one "- name" per line

`Membership` is the live subset: the cluster restricted to it (`live_cluster`, planned on as any
cluster) and the map back to the full cluster's device indices (`lift`), so that a plan made on the
live devices names devices of the file `geotrain train --cluster` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from geotrain.cluster.devices import DeviceListError
from geotrain.cluster.model import Cluster
from geotrain.errors import shown
from geotrain.yaml_text import document_errors_as, parse_document, read_text_file


def device_index(cluster: Cluster, item: Any, source: str) -> int:
    """The index of the device `item` names (a device name, or an index 0..N-1 as int or digits);
    DeviceListError naming the value, what is allowed and `source` otherwise."""
    text = str(item).strip() if isinstance(item, (str, int)) and not isinstance(item, bool) else None
    if text is not None and text in cluster.device_names:
        return cluster.device_names.index(text)
    if text is not None and text.isdigit() and int(text) < cluster.n_devices:
        return int(text)
    names = ", ".join(cluster.device_names[:4]) + (", ..." if cluster.n_devices > 4 else "")
    raise DeviceListError(f"{source}: unknown device {shown(item)}: cluster {shown(cluster.name)} has devices "
                          f"0..{cluster.n_devices - 1} named {names}")


def parse_device_names(text: str) -> list[str]:
    """'a, b,3' -> ['a', 'b', '3'] (blank items skipped)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def read_membership_file(path: str | Path) -> list[Any]:
    """The live devices a membership file lists (names or indices, unresolved)."""
    with document_errors_as(DeviceListError):
        doc = parse_document(read_text_file(path), str(path))
    if not isinstance(doc, list):
        raise DeviceListError(f"{path}: a membership file is a list of live devices (names or indices), "
                              f"got {type(doc).__name__}")
    return doc


def restrict_cluster(cluster: Cluster, devices: Sequence[int]) -> Cluster:
    """`cluster` with only `devices` (ascending indices), in that order; regions left empty are dropped;
    names, GPUs, hosts, GPU indices, NICs, memory limits and links of the kept devices as they were."""
    keep = np.asarray(devices, dtype=np.int64)
    regions, region_of = np.unique(cluster.region_of[keep], return_inverse=True)
    return Cluster(name=cluster.name, device_names=tuple(cluster.device_names[d] for d in keep),
                   region_names=tuple(cluster.region_names[g] for g in regions), region_of=region_of,
                   gpus=tuple(cluster.gpus[d] for d in keep),
                   bandwidth_gbps=cluster.bandwidth_gbps[np.ix_(keep, keep)],
                   latency_ms=cluster.latency_ms[np.ix_(keep, keep)],
                   hosts=tuple(cluster.hosts[d] for d in keep), gpu_index=tuple(cluster.gpu_index[d] for d in keep),
                   nic_gbps=cluster.nic_gbps[keep], memory_gib=cluster.memory_gib[keep],
                   prices=None if cluster.prices is None else cluster.prices.of_regions(regions))


@dataclass(frozen=True, eq=False)
class Membership:
    """The live devices of `cluster`: `live` (ascending full-cluster indices) and the excluded rest."""

    cluster: Cluster
    live: tuple[int, ...]

    @classmethod
    def excluding(cls, cluster: Cluster, excluded: Sequence[Any], source: str) -> Membership:
        """Every device but `excluded` (names or indices); excluding every device is refused."""
        gone = {device_index(cluster, item, source) for item in excluded}
        live = tuple(d for d in range(cluster.n_devices) if d not in gone)
        if not live:
            raise DeviceListError(f"{source}: excludes all {cluster.n_devices} devices of cluster "
                                  f"{shown(cluster.name)}; at least one must stay live")
        return cls(cluster, live)

    @classmethod
    def listing(cls, cluster: Cluster, live: Sequence[Any], source: str) -> Membership:
        """Exactly the devices `live` lists (names or indices, each once, at least one)."""
        indices = [device_index(cluster, item, f"{source}[{i}]") for i, item in enumerate(live)]
        if not indices:
            raise DeviceListError(f"{source}: lists no live device; at least one of cluster "
                                  f"{shown(cluster.name)}'s {cluster.n_devices} must stay live")
        twice = next((d for d in indices if indices.count(d) > 1), None)
        if twice is not None:
            raise DeviceListError(f"{source}: device {shown(cluster.device_names[twice])} is listed twice")
        return cls(cluster, tuple(sorted(indices)))

    @property
    def excluded(self) -> tuple[int, ...]:
        return tuple(d for d in range(self.cluster.n_devices) if d not in self.live)

    def live_cluster(self) -> Cluster:
        """The cluster of the live devices only (device i of it is full-cluster device live[i])."""
        return restrict_cluster(self.cluster, self.live)

    def lift(self, assignment: Any) -> np.ndarray:
        """An assignment on the live cluster as full-cluster device indices."""
        return np.asarray(self.live, dtype=np.int64)[np.asarray(assignment, dtype=np.int64)]

    def to_json(self) -> dict[str, Any]:
        """What a plan records: the excluded devices (indices and names) and how many stayed live."""
        return {"excluded_devices": list(self.excluded),
                "excluded_device_names": [self.cluster.device_names[d] for d in self.excluded],
                "live_devices": len(self.live), "cluster_devices": self.cluster.n_devices}
