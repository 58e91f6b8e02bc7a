"""Sharded replicas: each (stage, replica) slot is K devices of one site holding FSDP2 shards of its stage.

The planner sees a slot as one device of a *slot cluster* (`slot_cluster`), so that every cost model and
search method runs on it unchanged; what K changes is priced here:
- compute: the K devices of a slot split the slot's share of the batch (FSDP is data parallel inside the slot:
  each device runs b / K of every micro-batch of b sequences), so a slot computes K times as fast as one of its
  devices. A slot is as fast as its slowest device and holds what its smallest holds: its GPU type in the slot
  cluster is its slowest device's (ties: the one with less memory); FSDP's per-layer collectives keep the K in step.
- between slots: the data-parallel exchange (and the outer sync of a WAN recipe) runs per shard, between the
  same shard's peers (torchft's HSDP, INTELLECT-1's DiLoCo + FSDP2): K exchanges of 1/K of the stage at once.
  Pipeline activations go shard to shard (device k of a slot sends its b / K sequences to device k of the next
  stage's slot): K messages of 1/K at once. So a slot pair (A, B) is one link of latency max_k a(A_k, B_k) and
  bandwidth K x min_k b(A_k, B_k). Exact where the K same-shard links of a pair are alike (every cluster in
  compact region form: a link's figures are its two regions'); otherwise the slowest shard pair paces the K
  (an upper bound on the time).
- inside a slot (`fsdp_seconds`): per step a slot all-gathers its stage's 16-bit parameters P_s (bytes) for the
  forward, again for the backward (FSDP2's reshard_after_forward=True; False: once), and reduce-scatters the
  gradients: each a ring over the K devices, (K - 1) x (a + 8 P_s / (K b)) seconds on the slot's slowest
  intra-site link (Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel", VLDB 2023,
  Sec. 3.1-3.2; the ring all-gather / reduce-scatter cost of Thakur et al., "Optimization of Collective
  Communication Operations in MPICH", IJHPCA 2005). Charged beside the slot's compute, not overlapped with it
  (FSDP2 prefetches; this is the upper end). P_s is the largest stage's (the embedding's stages included).
K = 1 changes nothing: the slot cluster is the cluster and the FSDP seconds are 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cluster.gpus import GPU_MEMORY_GIB, GPU_PEAK_TFLOPS
from geotrain.cluster.membership import restrict_cluster
from geotrain.cost.memory import stage_params
from geotrain.errors import GeotrainError, shown
from geotrain.job import Job


class ShardError(GeotrainError, ValueError):
    """A shard count or a slot's devices out of range (not one site, repeated, used twice)."""


MAX_SHARDS = 1024
"""The largest K a plan may ask for (a slot is K devices of one site)."""


def check_shards(k: object, where: str = "--shards") -> int:
    """K as an integer in 1..MAX_SHARDS; ShardError naming `where` otherwise."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SHARDS:
        raise ShardError(f"{where} must be an integer in 1..{MAX_SHARDS} (devices of one site per slot), "
                         f"got {shown(k)}")
    return k


def _weakness(gpu: str) -> tuple[float, float]:
    """(peak TFLOP/s, memory GiB) of a GPU type; 0 for an unknown type (sorts last, as the slowest)."""
    return GPU_PEAK_TFLOPS.get(gpu, 0.0), GPU_MEMORY_GIB.get(gpu, 0.0)


def group_slots(cluster: Cluster, k: int) -> np.ndarray:
    """(n_slots, K) device indices: every region's devices K at a time, fastest (then largest) first, so that
    devices of one GPU type share a slot; a region's last n mod K devices are left out. K = 1: every device."""
    check_shards(k)
    slots = []
    for region in range(cluster.n_regions):
        devices = sorted(cluster.devices_in_region(region).tolist(),
                         key=lambda d: (*(-x for x in _weakness(cluster.gpus[d])), d))
        slots += [devices[i:i + k] for i in range(0, len(devices) - k + 1, k)]
    return np.array(slots, dtype=np.int64).reshape(-1, k)


def check_slots(cluster: Cluster, devices: np.ndarray, where: str = "shards.devices") -> None:
    """ShardError unless every slot of `devices` (..., K) names K distinct devices of the cluster in one region
    and no device serves two slots."""
    flat = np.asarray(devices, dtype=np.int64).reshape(-1, np.shape(devices)[-1])
    if flat.size and (flat.min() < 0 or flat.max() >= cluster.n_devices):
        bad = int(flat[(flat < 0) | (flat >= cluster.n_devices)][0])
        raise ShardError(f"{where}: device {bad} is not in cluster {shown(cluster.name)} (0..{cluster.n_devices - 1})")
    seen: dict[int, int] = {}
    for i, slot in enumerate(flat.tolist()):
        regions = {cluster.site_of(d) for d in slot}
        if len(regions) > 1:
            raise ShardError(f"{where}: slot {i} spans sites {', '.join(sorted(regions))}: a slot's K devices "
                             f"must be in one site (FSDP's collectives run on intra-site links)")
        for d in slot:
            if d in seen:
                same = "twice in slot" if seen[d] == i else f"in slots {seen[d]} and"
                raise ShardError(f"{where}: device {d} ({cluster.device_names[d]}) is used {same} {i}")
            seen[d] = i


def slot_cluster(cluster: Cluster, slots: np.ndarray) -> Cluster:
    """The cluster whose device i is slot `slots[i]` (see the module docstring): its weakest device's GPU type,
    latency max_k and bandwidth K x min_k over the same-shard device pairs, NIC K x its smallest, memory its
    smallest device's (each holds 1/K of the slot's state); no hosts."""
    slots = np.asarray(slots, dtype=np.int64)
    k = slots.shape[1]
    if k == 1 and np.all(np.diff(slots[:, 0]) > 0):
        return restrict_cluster(cluster, slots[:, 0])
    weakest = [min(slot, key=lambda d: (*_weakness(cluster.gpus[d]), d)) for slot in slots.tolist()]
    a, b = slots[:, None, :], slots[None, :, :]  # (n, n, K): same-shard pairs
    bandwidth = k * cluster.bandwidth_gbps[a, b].min(axis=-1)
    latency = cluster.latency_ms[a, b].max(axis=-1)
    regions, region_of = np.unique(cluster.region_of[slots[:, 0]], return_inverse=True)
    names = tuple(f"{cluster.device_names[s[0]]}+{k - 1}" for s in slots.tolist())
    return Cluster(name=cluster.name, device_names=names, region_names=tuple(cluster.region_names[g] for g in regions),
                   region_of=region_of, gpus=tuple(cluster.gpus[d] for d in weakest),
                   bandwidth_gbps=np.where(np.eye(len(slots), dtype=bool), 0.0, bandwidth),
                   latency_ms=np.where(np.eye(len(slots), dtype=bool), 0.0, latency),
                   nic_gbps=k * cluster.nic_gbps[slots].min(axis=-1),
                   memory_gib=_slot_memory_gib(cluster, slots),
                   prices=None if cluster.prices is None else cluster.prices.of_regions(regions))


def _slot_memory_gib(cluster: Cluster, slots: np.ndarray) -> np.ndarray:
    """(n,) per slot: the smallest memory of its devices in GiB where one of them gives `memory_gib`, else NaN (the
    slot's GPU type's datasheet)."""
    limited = ~np.isnan(cluster.memory_gib[slots]).all(axis=-1)
    memory = np.full(len(slots), np.nan)
    if limited.any():
        each = cluster.memory_bytes_of(slots[limited].ravel()).reshape(-1, slots.shape[1])
        memory[limited] = each.min(axis=-1) / 2.0**30
    return memory


@dataclass(frozen=True)
class Sharding:
    """K devices per slot and what FSDP's traffic inside a slot costs: `intra_s` maps a site's name to
    (latency s, bandwidth bit/s) of the slowest intra-slot link there; `gathers`: parameter all-gathers per step
    (2: forward and backward, FSDP2's reshard_after_forward=True; 1: False)."""

    k: int = 1
    intra_s: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    gathers: int = 2

    def __post_init__(self) -> None:
        check_shards(self.k, "shards")
        if self.gathers not in (1, 2):
            raise ShardError(f"FSDP all-gathers per step must be 1 or 2, got {shown(self.gathers)}")

    @classmethod
    def of_slots(cls, cluster: Cluster, slots: np.ndarray, gathers: int = 2) -> Sharding:
        """The sharding of these slots (n, K): each site's slowest link between two devices of one slot."""
        slots = np.asarray(slots, dtype=np.int64)
        intra: dict[str, tuple[float, float]] = {}
        for slot in slots.tolist():
            pairs = [(i, j) for i in slot for j in slot if i < j]
            if not pairs:
                continue
            latency = max(float(cluster.latency_s[i, j]) for i, j in pairs)
            bandwidth = min(float(cluster.bandwidth_bps[i, j]) for i, j in pairs)
            site = cluster.site_of(slot[0])
            old = intra.get(site, (0.0, np.inf))
            intra[site] = (max(old[0], latency), min(old[1], bandwidth))
        return cls(k=int(slots.shape[1]), intra_s=intra, gathers=gathers)

    def fsdp_seconds(self, slots: Cluster, stage_bytes: float) -> np.ndarray:
        """(N,) seconds per step of each slot of the slot cluster `slots` gathering and reduce-scattering a stage
        of `stage_bytes` 16-bit parameter bytes among its K devices (0 for K = 1)."""
        if self.k == 1:
            return np.zeros(slots.n_devices)
        figures = np.array([self.intra_s.get(slots.site_of(d), (0.0, np.inf)) for d in range(slots.n_devices)])
        ring = (self.k - 1) * (figures[:, 0] + 8.0 * stage_bytes / self.k / figures[:, 1])
        return (self.gathers + 1) * ring

    def to_json(self) -> dict:
        return {"k": self.k, "gathers_per_step": self.gathers}


NO_SHARDING = Sharding()


def largest_stage_param_bytes(job: Job, stages: int) -> float:
    """16-bit bytes of the largest stage's parameters (what a slot all-gathers): cost.memory's stage_params."""
    return float(stage_params(job, stages).max()) * job.bytes_per_value


def lift_slots(slots: np.ndarray, assignment: np.ndarray) -> np.ndarray:
    """(S, R, K) devices of the full cluster for an (S, R) assignment of slot-cluster devices."""
    return np.asarray(slots, dtype=np.int64)[np.asarray(assignment, dtype=np.int64)]


def slot_view(cluster: Cluster, devices: np.ndarray, gathers: int = 2) -> tuple[Cluster, Sharding, np.ndarray]:
    """A sharded layout `devices` (S, R, K) as the cost models see it: the slot cluster of its S x R slots (slot
    s*R + r is `devices[s, r]`), their Sharding, and the (S, R) assignment of slot-cluster devices."""
    devices = np.asarray(devices, dtype=np.int64)
    stages, replicas, k = devices.shape
    slots = devices.reshape(-1, k)
    return (slot_cluster(cluster, slots), Sharding.of_slots(cluster, slots, gathers),
            np.arange(stages * replicas, dtype=np.int64).reshape(stages, replicas))
