"""The cluster: devices grouped in regions, with symmetric bandwidth and latency between every pair.

Units: bandwidth in Gbit/s (1 Gbit/s = 1e9 bit/s), latency in milliseconds, as in files and output.
`bandwidth_bps` and `latency_s` give SI values for cost models. The diagonal of both matrices is
meaningless (a device does not talk to itself) and is stored as 0.

Where devices run: `hosts[d]` names device d's machine and `gpu_index[d]` its GPU on that machine
(None: not given; no host anywhere means one machine). `nic_gbps[d]` is device d's NIC, shared by
everything d sends at once, in Gbit/s (inf: unlimited, only the links limit it). `memory_gib[d]` caps the
GPU memory a job may use on d, in GiB (NaN: the GPU type's datasheet).

Limits (so that every cost stays a finite number and the N x N matrices fit in memory):
at most MAX_DEVICES devices (two dense float64 N x N matrices of 512 MiB each at the cap; loading
one peaks near 3 GB), bandwidth in MIN_GBPS..MAX_GBPS (1 kbit/s .. 1 Pbit/s) and latency in
0..MAX_MS (1000 s) between any two devices.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from geotrain.cluster.errors import ClusterError
from geotrain.cluster.gpus import gpu_memory_bytes
from geotrain.cluster.prices import Prices
from geotrain.errors import shown

MAX_DEVICES = 8192
MIN_GBPS = 1e-6
MAX_GBPS = 1e6
MAX_MS = 1e6
MAX_MEMORY_GIB = 65536.0
"""The largest `memory_gib` a device may give (64 TiB)."""


def check_device_count(n_devices: int, where: str) -> None:
    """Raise ClusterError when a cluster would exceed MAX_DEVICES (call before allocating N x N matrices)."""
    if n_devices > MAX_DEVICES:
        raise ClusterError(f"{where}: {n_devices:,} devices exceed the limit of {MAX_DEVICES:,} "
                           f"(dense N x N link matrices)")


@dataclass(frozen=True)
class Link:
    """One symmetric link figure: bandwidth in Gbit/s and one-way latency in ms."""

    gbps: float
    ms: float


@dataclass(frozen=True, eq=False)
class Cluster:
    """Devices, their regions and GPU types, and the N x N link matrices.

    `region_of[d]` is the index into `region_names` of device d. Matrices are read-only numpy arrays.
    `hosts`, `gpu_index` (None entries: not given) and `nic_gbps` (inf: unlimited) have one entry
    per device; left out (None), nothing is given and every NIC is unlimited. `memory_gib` (one entry per device,
    NaN: not given): the GPU memory a job may use, in GiB, where it is less than the GPU type's datasheet (a MIG
    slice, a GPU shared with other jobs); `memory_bytes` is each device's, the datasheet's where not given.
    `prices` (cluster/prices.py): USD per GPU-hour by GPU type and per GB leaving each region, or None (not given).
    """

    name: str
    device_names: tuple[str, ...]
    region_names: tuple[str, ...]
    region_of: np.ndarray
    gpus: tuple[str, ...]
    bandwidth_gbps: np.ndarray
    latency_ms: np.ndarray
    hosts: tuple[str | None, ...] | None = None
    gpu_index: tuple[int | None, ...] | None = None
    nic_gbps: np.ndarray | None = None
    prices: Prices | None = None
    memory_gib: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.device_names)
        region_of = np.asarray(self.region_of, dtype=np.int64)
        bandwidth = np.array(self.bandwidth_gbps, dtype=np.float64)
        latency = np.array(self.latency_ms, dtype=np.float64)
        if n == 0:
            raise ClusterError(f"cluster {shown(self.name)}: needs at least one device")
        check_device_count(n, f"cluster {shown(self.name)}")
        if len(set(self.device_names)) != n:
            raise ClusterError(f"cluster {shown(self.name)}: device names must be unique")
        if region_of.shape != (n,) or len(self.gpus) != n:
            raise ClusterError(f"cluster {shown(self.name)}: region_of and gpus need one entry per device ({n})")
        if region_of.min() < 0 or region_of.max() >= len(self.region_names):
            raise ClusterError(f"cluster {shown(self.name)}: region index out of range")
        for label, matrix in (("bandwidth_gbps", bandwidth), ("latency_ms", latency)):
            if matrix.shape != (n, n):
                raise ClusterError(f"cluster {shown(self.name)}: {label} must be {n}x{n}, got {matrix.shape}")
            if not np.all(np.isfinite(matrix)):
                raise ClusterError(f"cluster {shown(self.name)}: {label} has a non-finite entry")
            if not np.array_equal(matrix, matrix.T):
                raise ClusterError(f"cluster {shown(self.name)}: {label} must be symmetric")
        off = ~np.eye(n, dtype=bool)
        if n > 1 and not MIN_GBPS <= bandwidth[off].min() <= bandwidth[off].max() <= MAX_GBPS:
            raise ClusterError(f"cluster {shown(self.name)}: bandwidth_gbps must be in {MIN_GBPS:g}..{MAX_GBPS:g} "
                               f"off the diagonal, got {bandwidth[off].min():g}..{bandwidth[off].max():g}")
        if n > 1 and not 0 <= latency[off].min() <= latency[off].max() <= MAX_MS:
            raise ClusterError(f"cluster {shown(self.name)}: latency_ms must be in 0..{MAX_MS:g}, "
                               f"got {latency[off].min():g}..{latency[off].max():g}")
        np.fill_diagonal(bandwidth, 0.0)
        np.fill_diagonal(latency, 0.0)
        self._set_placement(n)
        if self.prices is not None:
            self.prices.check(self.gpus, len(self.region_names), self.name)
        for array in (region_of, bandwidth, latency):
            array.setflags(write=False)
        object.__setattr__(self, "region_of", region_of)
        object.__setattr__(self, "bandwidth_gbps", bandwidth)
        object.__setattr__(self, "latency_ms", latency)

    def _set_placement(self, n: int) -> None:
        """Check and normalise hosts, gpu_index and nic_gbps to one entry per device."""
        where = f"cluster {shown(self.name)}"
        hosts = (None,) * n if self.hosts is None else tuple(self.hosts)
        gpu_index = (None,) * n if self.gpu_index is None else tuple(self.gpu_index)
        nic = np.full(n, np.inf) if self.nic_gbps is None else np.array(self.nic_gbps, dtype=np.float64)
        if len(hosts) != n or len(gpu_index) != n or nic.shape != (n,):
            raise ClusterError(f"{where}: hosts, gpu_index and nic_gbps need one entry per device ({n})")
        for d, host in enumerate(hosts):
            if host is not None and (not isinstance(host, str) or not host.strip()):
                raise ClusterError(f"{where}: host of device {shown(self.device_names[d])} must be a non-empty "
                                   f"string, got {shown(host)}")
        for d, gpu in enumerate(gpu_index):
            if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0):
                raise ClusterError(f"{where}: gpu_index of device {shown(self.device_names[d])} must be an "
                                   f"integer >= 0, got {shown(gpu)}")
        placed = [(h, g) for h, g in zip(hosts, gpu_index) if h is not None and g is not None]
        if len(set(placed)) != len(placed):
            twice = next(p for p in placed if placed.count(p) > 1)
            raise ClusterError(f"{where}: two devices on host {shown(twice[0])} use GPU {twice[1]}")
        if np.any(np.isnan(nic)) or np.any(nic < MIN_GBPS) or np.any((nic > MAX_GBPS) & np.isfinite(nic)):
            raise ClusterError(f"{where}: nic_gbps must be in {MIN_GBPS:g}..{MAX_GBPS:g} (or inf: unlimited), "
                               f"got {nic.min():g}..{nic.max():g}")
        nic.setflags(write=False)
        memory = np.full(n, np.nan) if self.memory_gib is None else np.array(self.memory_gib, dtype=np.float64)
        given = memory[~np.isnan(memory)]
        if memory.shape != (n,) or np.any(~np.isfinite(given)) or np.any(given <= 0) or np.any(given > MAX_MEMORY_GIB):
            raise ClusterError(f"{where}: memory_gib needs one entry per device ({n}), each in (0, {MAX_MEMORY_GIB:g}] "
                               f"GiB or not given")
        memory.setflags(write=False)
        object.__setattr__(self, "memory_gib", memory)
        object.__setattr__(self, "hosts", hosts)
        object.__setattr__(self, "gpu_index", gpu_index)
        object.__setattr__(self, "nic_gbps", nic)

    @property
    def memory_bytes(self) -> np.ndarray:
        """(N,) GPU memory per device in bytes (memory_bytes_of every device)."""
        return self.memory_bytes_of(range(self.n_devices))

    def memory_bytes_of(self, devices: Iterable[int]) -> np.ndarray:
        """GPU memory of `devices` in bytes, in their order: the file's `memory_gib` x 2**30 where given, else the
        GPU type's (geotrain.cluster.gpus.gpu_memory_bytes; UnknownGpuError for a device of unknown type without
        one)."""
        return np.array([self.memory_gib[d] * 2.0**30 if not math.isnan(self.memory_gib[d])
                         else gpu_memory_bytes(self.gpus[d]) for d in map(int, devices)], dtype=np.float64)

    @property
    def has_hosts(self) -> bool:
        """True when at least one device names its host."""
        return any(host is not None for host in self.hosts)

    @property
    def n_devices(self) -> int:
        return len(self.device_names)

    @property
    def n_regions(self) -> int:
        return len(self.region_names)

    @property
    def bandwidth_bps(self) -> np.ndarray:
        """Bandwidth in bit/s (diagonal 0)."""
        return self.bandwidth_gbps * 1e9

    @property
    def latency_s(self) -> np.ndarray:
        """One-way latency in seconds (diagonal 0)."""
        return self.latency_ms * 1e-3

    def site_of(self, device: int) -> str:
        """The name of `device`'s region (its site)."""
        return str(self.region_names[int(self.region_of[int(device)])])

    def devices_in_region(self, region: int) -> np.ndarray:
        """Device indices of region `region`, ascending."""
        return np.flatnonzero(self.region_of == region)

    def region_sizes(self) -> np.ndarray:
        """Number of devices per region."""
        return np.bincount(self.region_of, minlength=self.n_regions)

    def region_link(self, a: int, b: int) -> Link | None:
        """The link between regions a and b (a == b: inside the region) if it is uniform, else None."""
        rows, cols = self.devices_in_region(a), self.devices_in_region(b)
        block_bw = self.bandwidth_gbps[np.ix_(rows, cols)]
        block_ms = self.latency_ms[np.ix_(rows, cols)]
        if a == b:
            if len(rows) < 2:
                return None
            mask = ~np.eye(len(rows), dtype=bool)
            block_bw, block_ms = block_bw[mask], block_ms[mask]
        if block_bw.size == 0:
            return None
        if np.ptp(block_bw) > 0 or np.ptp(block_ms) > 0:
            return None
        return Link(gbps=float(block_bw.flat[0]), ms=float(block_ms.flat[0]))

    def fingerprint(self) -> str:
        """A hash of what a placement depends on: the device count, each device's region and GPU type, the
        bandwidth and latency matrices and the NICs (not the names of devices, regions or hosts): 16 hex
        digits of a sha256 (the memory limits too, where the file gives them). A plan records its cluster's (geotrain.plan)."""
        nic = [None if not np.isfinite(x) else float(x) for x in self.nic_gbps]
        doc = {"devices": self.n_devices, "region_of": self.region_of.tolist(), "gpus": list(self.gpus),
               "bandwidth_gbps": self.bandwidth_gbps.tolist(), "latency_ms": self.latency_ms.tolist(), "nic_gbps": nic}
        if not np.all(np.isnan(self.memory_gib)):  # only where given: the fingerprints of files without it stay
            doc["memory_gib"] = [None if math.isnan(x) else float(x) for x in self.memory_gib]
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def is_region_uniform(self) -> bool:
        """True when every device pair's link depends only on the two devices' regions."""
        for a in range(self.n_regions):
            for b in range(a, self.n_regions):
                rows, cols = self.devices_in_region(a), self.devices_in_region(b)
                if a == b and len(rows) < 2:
                    continue
                if len(rows) and len(cols) and self.region_link(a, b) is None:
                    return False
        return True
