"""The end of a worker's iteration: its stage's gradient synchronisation (geotrain.sync), built from
the run's options.

Global clipping (`--clip-grad-norm X`): the norm of the whole model's averaged gradient, all stages,
is sqrt(sum over stages of |g_s|^2). Every rank adds the squares of its stage's averaged gradient and
one float64 scalar all-reduce over the world sums them; each stage's R replicas hold the same
averaged gradient, so the sum counts every stage R times and is divided by R
(`world_sum_over_replicas`). The scalar all-reduce is not timed as DP communication (one latency per
step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from geotrain.cluster import Cluster
from geotrain.comm.gather import GatherLinks
from geotrain.comm.hierarchical import HierarchicalGroups
from geotrain.comm.regions import regions_of_devices
from geotrain.runtime.layout import Layout, Slot
from geotrain.runtime.transport import Transport
from geotrain.sync import DPGroup, GradientSync, SyncError, SyncOptions, make_gradient_sync
from geotrain.sync.sharded import check_sharded_settings


def world_sum_over_replicas(replicas: int) -> Callable[[float], float]:
    """sum_squares for clip_grad_norm_: this rank's value summed over the world, divided by `replicas`."""
    def sum_squares(local: float) -> float:
        total = torch.tensor([local], dtype=torch.float64)
        dist.all_reduce(total)
        return float(total.item()) / replicas

    return sum_squares


def world_max(value: float) -> float:
    """`value`'s max over this process's world (an elastic group's S x K processes)."""
    total = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    return float(total.item())


def create_stage_hierarchies(layout: Layout, region_of_device: Sequence[int],
                             timeout_s: float) -> list[list[HierarchicalGroups]]:
    """The hierarchy of every stage's DP group per shard ([stage][shard]; one shard without --shards: a sharded
    plan's DP group of shard k is the same shard's peers, so its regions hold the region's same-shard ranks),
    created on every rank in stage, then shard order (torch's new_group rule), its collectives bounded by
    `timeout_s` seconds (the run's --comm-timeout)."""
    return [[HierarchicalGroups.create(regions_of_devices(layout.dp_group_ranks(s, k), layout.dp_group_devices(s, k),
                                                          region_of_device), timeout_s=timeout_s)
             for k in range(layout.k)] for s in range(layout.stages)]


def stage_gradient_sync(options: SyncOptions, stage: torch.nn.Module, transport: Transport, group: object,
                        hierarchy: HierarchicalGroups | None, rank: int, replicas: int,
                        cluster: Cluster | None = None, timeout_s: float | None = None,
                        shard_group: object = None, replica_group: object = None) -> GradientSync:
    """The gradient sync of global `rank`'s stage module over its stage's DP group `group` (the process
    group; a sharded slot's: the same shard's peers), the hierarchy of that group with --dp-hierarchical (else
    None; a sharded slot's: its shard's peers', create_stage_hierarchies); `replicas` R for clipping; `cluster`:
    its links choose the gathered exchanges' algorithm (geotrain.comm.gather; None: ring); `timeout_s`: the
    collective timeout of the groups it creates (the run's --comm-timeout); `shard_group`: a sharded slot's FSDP2
    group (its parameters are DTensors: what the outer sync cannot serve on them is refused in one line,
    geotrain.sync.sharded); `replica_group`: the process group of the replica's ranks (stages and shards) when it
    has more than one, where adaptive local steps agree."""
    layout = transport.layout
    slot = layout.slot(rank)
    named = list(stage.named_parameters())
    if shard_group is not None:
        streaming = options.streaming
        check_sharded_settings(named, group, fragments=streaming.fragments, fragment_split=streaming.fragment_split)
    if options.heterogeneity.outer_sync != "sync":
        return _async_gradient_sync(options, stage, layout, slot, cluster, replicas, timeout_s, group,
                                    replica_group)
    devices = tuple(layout.dp_group_devices(slot.stage, slot.shard))
    links = None if cluster is None else GatherLinks.of_cluster(cluster, devices)
    dp_group = DPGroup(group, tuple(layout.dp_group_ranks(slot.stage, slot.shard)), devices, hierarchy, links,
                       replica_group)
    return make_gradient_sync(options, named, transport, dp_group, rank, world_sum_over_replicas(replicas))


def _async_gradient_sync(options: SyncOptions, stage: torch.nn.Module, layout: Layout, slot: Slot,
                         cluster: Cluster | None, replicas: int, timeout_s: float | None, group: object,
                         replica_group: object) -> GradientSync:
    """--outer-sync async*: a global model's server per position (`slot`'s stage and shard), on replica 0's rank of
    it, whose clients are the position's DP group `group`; a replica of several ranks agrees in `replica_group` on
    its count and checkpoint rounds (geotrain.sync.async_outer). async-hierarchical's regions are the cluster's,
    of the position's ranks (the region holding replica 0's first, so that its first rank hosts the global server).
    With --sync-moments the servers also merge the replicas' AdamW second moments (geotrain.sync.async_moments); with
    --fragments P each position's server is P fragment servers (geotrain.sync.async_fragments)."""
    from geotrain.sync.async_outer import AsyncOuterSync
    from geotrain.sync.async_step import AsyncOuterGradientSync, run_budget
    from geotrain.sync.factory import BETAS, WEIGHT_DECAY

    params = [p for p in stage.parameters() if p.requires_grad]
    position = layout.dp_group_ranks(slot.stage, slot.shard)
    regions = None
    if options.heterogeneity.outer_sync == "async-hierarchical":
        if cluster is None:
            raise SyncError("--outer-sync async-hierarchical needs the cluster's regions")
        found = regions_of_devices(position, layout.dp_group_devices(slot.stage, slot.shard), cluster.region_of)
        regions = sorted((sorted(region) for region in found.members), key=lambda region: region[0])
    budget = run_budget(options.total_steps, options.outer.sync_every, replicas)  # type: ignore[arg-type]
    adamw = torch.optim.AdamW(params, lr=options.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
    outer = AsyncOuterSync(params, options.outer.sync_every, outer_lr=options.outer.outer_lr,  # type: ignore[arg-type]
                           outer_momentum=options.outer.outer_momentum, regions=regions, budget=budget,
                           timeout_s=timeout_s, merge=options.heterogeneity.async_merge,
                           staleness_power=options.heterogeneity.async_staleness_power, position=position,
                           position_group=group, replica_group=replica_group,
                           moments=adamw if options.outer.sync_moments else None,
                           fragments=options.streaming.fragments, fragment_split=options.streaming.fragment_split)
    return AsyncOuterGradientSync(params, adamw, outer)
