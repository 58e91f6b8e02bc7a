"""Auto-configuration: choose stages S, replicas R, micro-batches M and the devices to use, under
per-device memory, to minimise the predicted iteration seconds of a job on a cluster.

Search space: S among the divisors of the job's layers (even layer splits), R among the divisors of
the global batch (whole sequences per replica), M among the powers of two (and R's whole batch)
dividing global_batch / R; devices: the pools "every GPU at least as fast as type t" for each GPU
type t present, minus the devices too small for the layout's largest stage (`cost.memory`). So slow
or small-memory devices may stay idle, and S x R may be below the pool size (idle devices too).
Scoring: the "yuan+compute" model (communication of "yuan" + GPipe compute with M micro-batches)
of the better of the `pipeline-local` and `dp-local` placements on the pool. Layouts are visited
cheapest lower bound first and skipped once their bound (compute of the S R fastest pool devices,
bubble included, + (R-1) and (S-1) times the pool's cheapest dp/pp pair) cannot beat the `top`-th
best found. Finalists (`refine` best) are re-placed with `hierarchical` (communication only) and
keep the better placement. With rank_model "schedule" (the default) the `finalists` (20) best
are then re-scored by the event-simulated "schedule" model and ranked by it. Every reported
candidate carries a lower bound, valid for its ranking model, over every placement of its layout
on its pool ("schedule": stage 0 computes M forwards and backwards and waits for the last
micro-batch to cross the pipeline and back, then the cheapest possible all-reduce).
Sharded replicas (cost/shards.py): each (stage, replica) slot may be K devices of one site holding FSDP2 shards.
With `shards` 0 (the default) K = 1 is searched, and only when nothing fits one device per slot every K in
`shard_choices` (powers of two up to the largest site), each on its slot cluster (a site's devices K at a time,
fastest first), the fastest configurations over all K reported; with SHARDS_ALWAYS, K = 1 and every K of
`shard_choices` together; with `shards` K, that K alone. The same search
runs on a slot cluster as on devices (a slot computes over its K devices, pays FSDP's traffic inside the site,
holds states / K: cost.memory), and the candidates name the full cluster's devices (`shard_devices`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cluster.membership import restrict_cluster
from geotrain.cost.compute import YuanComputeCostModel
from geotrain.cost.gpus import DEFAULT_UTILISATION, gpu_peak_flops
from geotrain.cost.memory import MemoryConfig, stage_memory_bytes
from geotrain.cost.schedule import ScheduleCostModel
from geotrain.cost.shards import NO_SHARDING, Sharding, group_slots, lift_slots, slot_cluster
from geotrain.cost.yuan import YuanCostModel
from geotrain.job import Job
from geotrain.search.base import PlacementProblem, SearchError
from geotrain.search.bounds import combinatorial_dp_bound
from geotrain.search.hierarchical import HierarchicalConfig, hierarchical_search
from geotrain.search.region_heuristics import RegionHeuristicConfig, dp_local, pipeline_local


RANK_MODELS = ("schedule", "yuan+compute")


class NoFeasibleConfigError(SearchError):
    """No (S, R, M, devices) layout fits the job in the cluster's memory."""


@dataclass(frozen=True)
class AutoConfigOptions:
    """memory: the memory-model knobs; top: candidates reported; refine: finalists re-placed with
    hierarchical; utilisation: fraction of peak FLOP/s sustained; max_stages: cap on S (0: none);
    rank_model: "schedule" (finalists re-ranked by the event simulation) or "yuan+compute";
    finalists: configurations the screen passes to the "schedule" ranking (at least `top`);
    refine_time_limit_s: the `hierarchical` re-placement's limit per finalist; sync_period: H, the DP
    exchange's period in steps (1: every step; H > 1 screens layouts for a WAN recipe, whose outer sync
    amortises the exchange over H steps: every model and bound charges dp / H); shards: K devices per slot
    (0: 1, or the K's of `shard_choices` when nothing fits one device; SHARDS_ALWAYS: 1 and those K's together);
    sharding: set by the search per K."""

    memory: MemoryConfig = field(default_factory=MemoryConfig)
    top: int = 5
    refine: int = 3
    utilisation: float = DEFAULT_UTILISATION
    max_stages: int = 0
    rank_model: str = "schedule"
    finalists: int = 20
    refine_time_limit_s: float = 10.0
    sync_period: int = 1
    shards: int = 0
    sharding: Sharding = NO_SHARDING

    def __post_init__(self) -> None:
        if isinstance(self.sync_period, bool) or not isinstance(self.sync_period, int) or self.sync_period < 1:
            raise SearchError(f"auto-config: the sync period must be an integer >= 1, got {self.sync_period!r}")
        if self.top < 1 or self.refine < 0 or self.finalists < 1:
            raise SearchError(f"auto-config: top, finalists must be >= 1 and refine >= 0, got {self.top}, "
                              f"{self.finalists}, {self.refine}")
        if self.rank_model not in RANK_MODELS:
            raise SearchError(f"auto-config ranks with {' or '.join(RANK_MODELS)}, got {self.rank_model!r}")


@dataclass(frozen=True)
class Candidate:
    """One evaluated configuration. assignment: (S, R) device indices of the full cluster;
    iteration_s: seconds by the ranking model ("yuan+compute": dp + max_r (pp_r + compute_r);
    "schedule": the simulated iteration); compute_s: "yuan+compute"'s compute, or the simulated
    pipeline makespan; memory_per_device_bytes: the largest stage's peak; bound_s: lower bound on
    iteration_s over every placement of this layout on its pool; screen_s: the "yuan+compute" total."""

    stages: int
    replicas: int
    microbatches: int
    assignment: np.ndarray
    iteration_s: float
    dp_s: float
    pp_s: float
    compute_s: float
    memory_per_device_bytes: float
    bound_s: float
    pool_size: int
    placement: str
    screen_s: float = 0.0
    model: str = "yuan+compute"
    split: dict | None = None
    """The speed split's `StageShares.describe` when it beat the equal split (None: equal split)."""
    shard_devices: np.ndarray | None = None
    """(S, R, K) devices of each slot with K > 1 shards (`assignment` is then each slot's first); None: K = 1."""

    @property
    def k(self) -> int:
        return 1 if self.shard_devices is None else int(self.shard_devices.shape[-1])

    @property
    def devices_used(self) -> int:
        return self.stages * self.replicas * self.k

    def tokens_per_s(self, job: Job) -> float:
        return job.global_batch * job.seq_len / self.iteration_s

    def to_json(self, job: Job) -> dict:
        return {"stages": self.stages, "replicas": self.replicas, "microbatches": self.microbatches,
                "devices_used": self.devices_used, "iteration_s": self.iteration_s, "tokens_per_s": self.tokens_per_s(job),
                "cost": {"dp": self.dp_s, "pp": self.pp_s, "compute": self.compute_s, "total": self.iteration_s},
                "memory_per_device_bytes": self.memory_per_device_bytes, "lower_bound": self.bound_s,
                "gap": max(0.0, 1.0 - self.bound_s / self.iteration_s), "pool_size": self.pool_size,
                "placement": self.placement, "cost_model": self.model, "yuan_compute_s": self.screen_s,
                "assignment": self.assignment.tolist(), **({"split": self.split} if self.split else {}),
                **({} if self.shard_devices is None else
                   {"shards": {"k": self.k, "gathers_per_step": 2, "devices": self.shard_devices.tolist()}})}


@dataclass(frozen=True)
class AutoConfigResult:
    candidates: list[Candidate]
    layouts_scored: int
    layouts_pruned: int
    seconds: float


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def microbatch_choices(per_replica: int) -> list[int]:
    """Powers of two dividing the per-replica batch, and the batch itself (one sequence each)."""
    powers = [1 << k for k in range(per_replica.bit_length()) if per_replica % (1 << k) == 0]
    return sorted(set(powers + [per_replica]))


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def _no_fit_error(cluster: Cluster, job: Job, memory: MemoryConfig, capacity: np.ndarray,
                  shards: int = 1) -> NoFeasibleConfigError:
    """Name the binding constraint: the least memory any layout needs vs the largest GPU (K `shards` per slot)."""
    best = None
    for S in divisors(job.layers):
        if S > cluster.n_devices:
            continue
        for R in divisors(job.global_batch):
            if S * R > cluster.n_devices:
                break
            M = job.global_batch // R
            need = stage_memory_bytes(job, S, R, M, memory, shards=shards)
            if best is None or need.max() < best[0].max():
                best = (need, S, R, M)
    big = int(np.argmax(capacity))
    if best is None:
        return NoFeasibleConfigError(f"auto-config: the cluster has {cluster.n_devices} devices, too few for any layout")
    need, S, R, M = best
    s = int(np.argmax(need))
    return NoFeasibleConfigError(
        f"auto-config: nothing fits: stage {s} needs {_gb(need[s])} even at S={S}, R={R}, M={M} "
        f"(zero={memory.zero}, recompute={memory.recompute}, shards={shards}), largest GPU has "
        f"{_gb(capacity[big])} ({cluster.gpus[big]}); try --zero 3, --recompute, more devices per site "
        f"(--shards) or larger GPUs")


SHARDS_ALWAYS = -1
"""`AutoConfigOptions.shards` for "search K = 1 and every K of shard_choices together" (plan --shards auto)."""


def shard_choices(cluster: Cluster) -> list[int]:
    """The K > 1 auto-configuration tries when nothing fits one device: powers of two up to the largest site."""
    largest = int(cluster.region_sizes().max())
    return [1 << i for i in range(1, largest.bit_length()) if (1 << i) <= largest]


def auto_configure(cluster: Cluster, job: Job, options: AutoConfigOptions = AutoConfigOptions(),
                   *, seed: int = 0) -> AutoConfigResult:
    """The `options.top` best configurations, fastest first (see the module docstring): K = 1, or the fastest over
    the sharded K's when nothing fits one device per slot, or `options.shards` alone."""
    if options.shards > 1:
        return _sharded(cluster, job, options, options.shards, seed)
    if options.shards == 1:
        return _auto_configure_on(cluster, job, options, seed)
    results, unsharded = [], None
    try:
        results.append(_auto_configure_on(cluster, job, replace(options, shards=1), seed))
    except NoFeasibleConfigError as exc:
        unsharded = exc
    if results and options.shards != SHARDS_ALWAYS:
        return results[0]
    for k in shard_choices(cluster):
        try:
            results.append(_sharded(cluster, job, options, k, seed))
        except NoFeasibleConfigError:
            continue
    if not results:
        raise unsharded
    found = sorted((c for r in results for c in r.candidates), key=lambda c: c.iteration_s)
    return AutoConfigResult(found[: options.top], sum(r.layouts_scored for r in results),
                            sum(r.layouts_pruned for r in results), sum(r.seconds for r in results))


def _sharded(cluster: Cluster, job: Job, options: AutoConfigOptions, k: int, seed: int) -> AutoConfigResult:
    """Auto-configuration on the slot cluster of K devices per slot, its candidates on the full cluster's devices."""
    slots = group_slots(cluster, k)
    if len(slots) == 0:
        raise NoFeasibleConfigError(f"auto-config: no site has {k} devices for a slot of {k} shards")
    result = _auto_configure_on(slot_cluster(cluster, slots), job,
                                replace(options, shards=k, sharding=Sharding.of_slots(cluster, slots)), seed)
    lifted = [replace(c, assignment=lift_slots(slots, c.assignment)[..., 0],
                      shard_devices=lift_slots(slots, c.assignment)) for c in result.candidates]
    return replace(result, candidates=lifted)


def _auto_configure_on(cluster: Cluster, job: Job, options: AutoConfigOptions, seed: int) -> AutoConfigResult:
    """The search on `cluster` (a slot cluster of options.sharding.k devices per slot when K > 1)."""
    start = time.perf_counter()
    k = options.sharding.k
    peak = np.array([gpu_peak_flops(g) for g in cluster.gpus]) * options.utilisation
    capacity = cluster.memory_bytes
    speeds = np.unique(peak)
    flops = job.flops_per_iteration()
    layouts = []
    for S in divisors(job.layers):
        if S > cluster.n_devices or (options.max_stages and S > options.max_stages):
            continue
        for R in divisors(job.global_batch):
            if S * R > cluster.n_devices:
                break
            for M in microbatch_choices(job.global_batch // R):
                need = stage_memory_bytes(job, S, R, M, options.memory, shards=k)
                for speed in speeds:
                    pool = np.flatnonzero((peak >= speed) & (capacity >= need.max()))
                    if pool.size < S * R or (pool.size and peak[pool].min() > speed):
                        continue  # too small, or the same pool as a faster threshold's
                    fastest = np.sort(1.0 / peak[pool])[: S * R]
                    slot = fastest * flops / (S * R * k)
                    compute_lb = slot.sum() / R * (1.0 / M + (M - 1.0) / (M * S))
                    layouts.append((compute_lb, S, R, M, pool, float(need.max())))
    if not layouts:
        raise _no_fit_error(cluster, job, options.memory, capacity, k)
    layouts.sort(key=lambda item: (item[0], item[1], item[2], item[3]))
    found: list[Candidate] = []
    keep = max(options.top, options.finalists if options.rank_model == "schedule" else 0)
    pruned = 0
    pool_cache: dict[bytes, Cluster] = {}
    for compute_lb, S, R, M, pool, need in layouts:
        key = pool.tobytes()
        if key not in pool_cache:
            sub = restrict_cluster(cluster, pool)
            pool_cache[key] = sub
        sub = pool_cache[key]
        bound = compute_lb + comm_lower_bound_s(sub, job, S, R, options.sync_period)
        if len(found) >= keep and bound >= found[keep - 1].iteration_s:
            pruned += 1
            continue
        model = YuanComputeCostModel.for_job(sub, job, S, R, utilisation=options.utilisation, micro_batches=M,
                                             sync_period=options.sync_period, sharding=options.sharding)
        problem = PlacementProblem(sub, model)
        heuristic = RegionHeuristicConfig(max_candidates=200)
        results = [method(problem, heuristic) for method in (pipeline_local, dp_local)]
        result = min(results, key=lambda r: r.cost.total)
        cost = result.cost
        candidate = Candidate(S, R, M, pool[result.assignment], cost.total, cost.dp, cost.pp, cost.extra["compute"],
                              need, bound, int(pool.size), result.method, cost.total)
        same = next((c for c in found if (c.stages, c.replicas, c.microbatches) == (S, R, M)), None)
        if same is not None:  # one row per (S, R, M): the best pool, the weakest bound of the pools tried
            found.remove(same)
            candidate = min(same, candidate, key=lambda c: c.iteration_s)
            candidate = replace(candidate, bound_s=min(same.bound_s, bound))
        found.append(candidate)
        found.sort(key=lambda c: c.iteration_s)
        del found[keep:]
    refined = [_refine(cluster, job, c, options, seed) for c in found[: options.refine]]
    found = sorted(refined + found[options.refine:], key=lambda c: c.iteration_s)
    if options.rank_model == "schedule":
        found = sorted((_schedule_rescore(cluster, job, c, options) for c in found), key=lambda c: c.iteration_s)
    else:
        found = sorted((better_split(cluster, job, c, options) for c in found), key=lambda c: c.iteration_s)
    return AutoConfigResult(found[: options.top], len(layouts) - pruned, pruned, time.perf_counter() - start)


def comm_lower_bound_s(pool: Cluster, job: Job, stages: int, replicas: int, sync_period: int = 1) -> float:
    """yuan's dp / H + pp of any placement on `pool` (seconds) is at least R - 1 pair exchanges (every
    `sync_period` H steps) and S - 1 cuts, each on the pool's least latency and fastest link."""
    off = ~np.eye(pool.n_devices, dtype=bool)
    latency, bandwidth = pool.latency_s[off].min(initial=0.0), pool.bandwidth_bps[off].max(initial=1.0)
    return (replicas - 1) * 2.0 * (latency + 8.0 * job.dp_bytes(stages) / replicas / bandwidth) / sync_period + \
        (stages - 1) * 2.0 * (latency + 8.0 * job.pp_bytes(replicas) / bandwidth)


def _refine(cluster: Cluster, job: Job, candidate: Candidate, options: AutoConfigOptions, seed: int) -> Candidate:
    """Re-place a finalist with `hierarchical` on its communication terms over the devices of its
    pool (pool: the devices as fast as its slowest, with enough memory); keep the faster placement."""
    S, R, M = candidate.stages, candidate.replicas, candidate.microbatches
    peak = np.array([gpu_peak_flops(g) for g in cluster.gpus])
    capacity = cluster.memory_bytes
    used = candidate.assignment.ravel()
    devices = np.flatnonzero((peak >= peak[used].min()) & (capacity >= candidate.memory_per_device_bytes))
    sub = restrict_cluster(cluster, devices)
    comm = YuanCostModel.for_job(sub, job, S, R, options.sync_period)
    result = hierarchical_search(PlacementProblem(sub, comm), HierarchicalConfig(starts=2, rounds=4, swaps=1000),
                                 seed=seed, time_limit_s=options.refine_time_limit_s)
    full = YuanComputeCostModel.for_job(sub, job, S, R, utilisation=options.utilisation, micro_batches=M,
                                        sync_period=options.sync_period, sharding=options.sharding)
    cost = full.evaluate(result.assignment)
    if cost.total >= candidate.iteration_s * (1 - 1e-12):
        return candidate
    return replace(candidate, assignment=devices[result.assignment], iteration_s=cost.total, dp_s=cost.dp,
                   pp_s=cost.pp, compute_s=cost.extra["compute"], placement="hierarchical", screen_s=cost.total)


def schedule_bound_s(cluster: Cluster, job: Job, pool: np.ndarray, stages: int, replicas: int, microbatches: int,
                     utilisation: float, any_split: bool = False, sync_period: int = 1, shards: int = 1) -> float:
    """Lower bound on the "schedule" model's iteration seconds of any placement of the layout on
    `pool`, f = one micro-batch forward on the pool's fastest GPU, hop = one micro-batch's
    activations (pp_bytes / M) over the pool's fastest link plus its least latency: every stage ends
    its last backward after >= 3 M f of its own compute and then all-reduces, so total >= 3 M f +
    the combinatorial dp bound; stage 0's last backward waits for the chain of the last micro-batch,
    >= (M + 3 S - 1) f + 2 (S - 1) hops (its M forwards at stage 0, then the other stages' forward
    and every backward, each cut crossed twice), and also >= 3 S f + 2 (S - 1) hops + (M - 1) x
    the busy time of one hop (cut 0's link carries the M activations one after another); then
    stage 0 all-reduces, >= R - 1 scatter-gather pair exchanges on the pool's cheapest link.
    any_split: valid for every layer split (the first chain term, which needs stage 0 to hold 1/S of
    the layers, is dropped; the others only use sums over stages and max >= mean), and the busiest
    stage's all-reduce is the cheapest one, not the combinatorial DP bound. sync_period: H, every DP term / H
    (the exchange every H steps); shards: K devices per slot of a slot cluster (each slot's forward / K; FSDP's
    traffic inside a slot only adds)."""
    peak = max(gpu_peak_flops(cluster.gpus[d]) for d in pool) * utilisation
    forward = job.flops_per_iteration() / 3.0 / (stages * replicas * microbatches * shards) / peak
    block = np.ix_(pool, pool)
    off = ~np.eye(len(pool), dtype=bool)
    latency = float(cluster.latency_s[block][off].min()) if len(pool) > 1 else 0.0
    bandwidth = float(cluster.bandwidth_bps[block][off].max()) if len(pool) > 1 else np.inf
    busy = 8.0 * job.pp_bytes(replicas) / microbatches / bandwidth
    hops = 2.0 * (stages - 1) * (busy + latency)
    chain = forward * 3.0 * stages + hops + (microbatches - 1.0) * busy * (stages > 1)
    if not any_split:  # stage 0's M forwards take M f only with its 1/S of the layers
        chain = max(chain, forward * (microbatches + 3.0 * stages - 1.0) + hops)
    busy_compute = forward * 3.0 * microbatches
    if replicas < 2:
        return max(chain, busy_compute)
    cheapest_dp = (replicas - 1) * 2.0 * (latency + 8.0 * job.dp_bytes(stages) / replicas / bandwidth) / sync_period
    if any_split:  # the busiest stage need not be the one with the dearest DP group
        return max(chain, busy_compute) + cheapest_dp
    dp_pair = YuanCostModel.for_job(restrict_cluster(cluster, pool), job, stages, replicas).pairwise_terms().dp_pair_s
    return max(chain + cheapest_dp, busy_compute + combinatorial_dp_bound(dp_pair, stages, replicas) / sync_period)


def better_split(cluster: Cluster, job: Job, candidate: Candidate, options: AutoConfigOptions,
                 rank_model: str = "yuan+compute") -> Candidate:
    """The candidate (placement kept) scored by `rank_model` with the better of the equal split and the
    speed split of its layers (`cost.layer_split`: faster stages take more layers); the speed split
    only where every stage's devices hold that stage's memory (`stage_memory_bytes` with its shares)."""
    S, R, M = candidate.stages, candidate.replicas, candidate.microbatches
    devices = np.unique(candidate.assignment)
    sub = restrict_cluster(cluster, devices)
    local = np.searchsorted(devices, candidate.assignment)
    capacity = sub.memory_bytes[local].min(axis=1)  # (S,) per stage

    def model(shares: str | None):
        if rank_model == "schedule":
            return ScheduleCostModel.for_job(sub, job, S, R, micro_batches=M, schedule=options.memory.schedule,
                                             utilisation=options.utilisation, layer_shares=shares,
                                             sync_period=options.sync_period, sharding=options.sharding)
        return YuanComputeCostModel.for_job(sub, job, S, R, utilisation=options.utilisation, micro_batches=M,
                                            layer_shares=shares, sync_period=options.sync_period,
                                            sharding=options.sharding)

    equal = model(None).evaluate(local)
    k = options.sharding.k
    best = (equal, None, float(stage_memory_bytes(job, S, R, M, options.memory, shards=k).max()))
    speed_model = model("speed")
    need = stage_memory_bytes(job, S, R, M, options.memory, speed_model.shares.of(local), shards=k)
    if np.all(capacity >= need):
        speed = speed_model.evaluate(local)
        if speed.total < equal.total * (1 - 1e-12):
            best = (speed, speed_model.shares.describe(local), float(need.max()))
    cost, split, memory = best
    compute = cost.extra["pipeline"] if rank_model == "schedule" else cost.extra["compute"]
    bound = candidate.bound_s
    if split is not None and rank_model != "schedule":
        # the screen's bound assumed 1/S of the layers per stage; any split, any pool: every slot at the
        # cluster's fastest peak and links, max_s >= mean_s for the bubble (GPipe: (1/M) sum + ((M-1)/M) max)
        slot = job.flops_per_iteration() / (R * k * options.utilisation * max(gpu_peak_flops(g) for g in cluster.gpus))
        bound = min(bound, slot * (1.0 / M + (M - 1.0) / (M * S))
                    + comm_lower_bound_s(cluster, job, S, R, options.sync_period))
    return replace(candidate, iteration_s=cost.total, dp_s=cost.dp, pp_s=cost.pp, compute_s=compute,
                   memory_per_device_bytes=memory, split=split, model=rank_model, bound_s=bound,
                   screen_s=candidate.screen_s if rank_model == "schedule" else cost.total)


def _schedule_rescore(cluster: Cluster, job: Job, candidate: Candidate, options: AutoConfigOptions) -> Candidate:
    """The candidate scored (better split, `better_split`) and bounded by the "schedule" model (its
    placement kept)."""
    S, R, M = candidate.stages, candidate.replicas, candidate.microbatches
    devices = np.unique(candidate.assignment)
    candidate = better_split(cluster, job, candidate, options, "schedule")
    peak = np.array([gpu_peak_flops(g) for g in cluster.gpus])
    capacity = cluster.memory_bytes
    pool = np.flatnonzero((peak >= peak[devices].min()) & (capacity >= candidate.memory_per_device_bytes))
    bound = schedule_bound_s(cluster, job, pool, S, R, M, options.utilisation, any_split=True,
                             sync_period=options.sync_period, shards=options.sharding.k)
    return replace(candidate, bound_s=bound)
