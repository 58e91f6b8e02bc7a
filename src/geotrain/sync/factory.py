"""`make_gradient_sync`: the one place that picks a GradientSync implementation from SyncOptions.

    optimizer onebit-adam              -> OneBitAdamSync (1-bit Adam averages over the group itself; with a
                                          hierarchy RegionOneBitAdam: regions are its workers)
    sync_every H                       -> OuterSync (local SGD / DiLoCo; outer gradients through the
                                          exchange below, every H steps); with fragments > 1,
                                          delay > 0 or sync_moments: StreamingOuterSync (one exchange
                                          per fragment; landing "mix" or "eager"; Adam's moments
                                          averaged in the same collective); with local_steps
                                          adaptive: AdaptiveOuterSync (H_r per replica by speed,
                                          geotrain.sync.adaptive; with a hierarchy per region)
    delay tau > 0 (no sync_every)      -> DelayedPerStepSync (the exchange below every step, overlapped
                                          with the next tau steps: delayed gradients)
    otherwise                          -> PerStepSync (the exchange below, every step)
    the exchange: hierarchical -> HierarchicalGradientExchange (the codec between regions; with moment sync
                                  one per part: HierarchicalPartsExchange);
                  flat         -> StageExchange (the codec reducer, or a registered reducer: PowerSGD)
With a hierarchy and sync_every, each region is one worker: its members average their gradients every
step at full precision (a StageExchange "none" on the region's group) before the inner step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.codecs import CodecSpec
from geotrain.optim import OneBitAdam
from geotrain.optim.region_collective import RegionOneBitAdam
from geotrain.optim.outer import OuterStep
from geotrain.optim.shards import is_sharded
from geotrain.sync.adaptive import AdaptiveOuterSync, Gather, gather_floats
from geotrain.sync.base import CollectivePause, CollectiveTransport, DPExchange, GradientSync, SyncError
from geotrain.sync.delayed import DelayedPerStepSync
from geotrain.sync.exchange import StageExchange, timed_collective
from geotrain.sync.hierarchical import hierarchical_exchange
from geotrain.sync.moments import MomentTensors, moment_parts
from geotrain.sync.onebit import OneBitAdamSync, timed_region_collective
from geotrain.sync.options import DPGroup, ExchangeOptions, SyncOptions
from geotrain.sync.outer import OuterSync
from geotrain.sync.per_step import PerStepSync
from geotrain.sync.sharded import site_agreed
from geotrain.sync.streaming import StreamingOuterSync

BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
"""AdamW's (and 1-bit Adam's) betas and decoupled weight decay."""


def onebit_adam(options: SyncOptions, params: Any, kind: type[OneBitAdam] = OneBitAdam, **extra: Any) -> OneBitAdam:
    """1-bit Adam (`kind`: OneBitAdam or RegionOneBitAdam) of `params` with the run's settings (learning rate,
    betas, weight decay, warm-up steps, clipping); `extra`: its collective and norm arguments."""
    return kind(params, lr=options.lr, betas=BETAS, weight_decay=WEIGHT_DECAY, warmup_steps=options.onebit_warmup_steps,
                max_grad_norm=options.clip_grad_norm, **extra)


def make_gradient_sync(options: SyncOptions, named_params: Sequence[tuple[str, torch.nn.Parameter]],
                       transport: CollectiveTransport, group: DPGroup, rank: int = 0,
                       sum_squares: Callable[[float], float] | None = None) -> GradientSync:
    """The sync of the module doc for the parameters `named_params` of this rank (global `rank`) in `group`.
    `sum_squares`: this rank's sum of squared gradients -> the global one (for clipping; None: local)."""
    if options.exchange.hierarchical != (group.hierarchy is not None):
        raise SyncError(f"make_gradient_sync: options.exchange.hierarchical is {options.exchange.hierarchical} but "
                        f"the DP group {'has' if group.hierarchy is not None else 'has no'} region hierarchy")
    named_params = list(named_params)
    params = [p for _, p in named_params]
    devices = list(group.devices)
    if options.optimizer == "onebit-adam":
        pause = CollectivePause()
        if group.hierarchy is None:
            on_gpu = any(p.device.type != "cpu" for p in params)  # state there, messages through host copies
            collective, kind = timed_collective(transport, group.handle, devices, pause, on_gpu), OneBitAdam
        else:
            collective = timed_region_collective(transport, group.hierarchy, rank, devices, pause)
            kind = RegionOneBitAdam
        optimizer = onebit_adam(options, named_params, kind, collective=collective, norm_sum_squares=sum_squares)
        return OneBitAdamSync(params, optimizer, collective, options.clip_grad_norm, pause)
    codec = options.exchange
    exchange = _exchange(codec, named_params, transport, group, rank)
    adamw = torch.optim.AdamW(params, lr=options.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
    outer, streaming = options.outer, options.streaming
    if outer.sync_every is None and streaming.delay > 0:
        return DelayedPerStepSync(params, exchange, adamw, streaming.delay, options.total_steps,
                                  options.clip_grad_norm, sum_squares)
    if outer.sync_every is None:
        return PerStepSync(params, exchange, adamw, options.clip_grad_norm, sum_squares)
    if options.heterogeneity.local_steps == "adaptive":  # (one fragment: SyncOptions refused the rest)
        gather = site_agreed(gather_floats(group.handle, lambda wait: transport.collective(
            group.handle, devices, 8, wait, posted=True), group.links), group.replica_group)  # a replica's ranks agree first
        replica, replicas, prior = group.ranks.index(rank), len(group.ranks), options.heterogeneity.local_steps_prior_s
        if group.hierarchy is not None:  # each region is one replica (geotrain.sync.adaptive's module doc)
            gather, replica, replicas, prior = _regions_as_replicas(gather, group, rank, prior)
        return AdaptiveOuterSync(named_params, adamw,
                                 lambda shadows, moments=None: _exchange(codec, shadows, transport, group, rank,
                                                                         moments),
                                 outer.sync_every, outer.outer_lr, outer.outer_momentum, gather, replica, replicas,
                                 prior_step_s=prior, delay=streaming.delay,
                                 landing=streaming.landing, mix=streaming.mix, warmup=streaming.warmup,
                                 periods=-(-options.total_steps // outer.sync_every), outer_state=outer.outer_state,
                                 inner_exchange=_region_exchange(named_params, transport, group, rank),
                                 sync_moments=outer.sync_moments, moment_syncs=outer.moment_syncs)
    # (warmup only matters with a delay); sharded parameters (DTensor): OuterSync writes whole-shape gradients into
    # them, the streaming sync keeps shard-sized shadows (geotrain.optim.shards), as geotrain.diloco does; so does the
    # outer state in host memory (the outer gradients travel in host shadows, not in the parameters' gradients)
    if (streaming.fragments > 1 or streaming.delay > 0 or outer.sync_moments or outer.outer_state == "host"
            or any(is_sharded(p) for p in params)):
        return StreamingOuterSync(named_params, adamw,
                                  lambda shadows, moments=None: _exchange(codec, shadows, transport, group,
                                                                          rank, moments),
                                  outer.sync_every, streaming.fragments, streaming.delay, streaming.mix,
                                  outer.outer_lr, outer.outer_momentum, options.total_steps,
                                  _region_exchange(named_params, transport, group, rank), streaming.landing,
                                  streaming.warmup, outer.sync_moments, outer.moment_syncs, streaming.fragment_split,
                                  outer.outer_state)
    step = OuterStep(params, outer.sync_every, outer.outer_lr, outer.outer_momentum)
    return OuterSync(params, adamw, step, exchange, options.total_steps,
                     _region_exchange(named_params, transport, group, rank))


def _exchange(options: ExchangeOptions, named_params: list[tuple[str, torch.nn.Parameter]],
              transport: CollectiveTransport, group: DPGroup, rank: int,
              moments: MomentTensors | None = None) -> DPExchange:
    """The DP exchange of `named_params` through the options' codec; `moments` (moment sync) travel beside
    them in the same collective (geotrain.sync.moments)."""
    if group.hierarchy is not None:
        return hierarchical_exchange(named_params, options.codec, options.error_feedback, transport, group.hierarchy,
                                     rank, list(group.devices), moments)
    if moments is not None:
        return StageExchange(named_params, options.codec, options.error_feedback, transport, group.handle,
                             list(group.devices), group.links, moment_parts(moments, options.codec,
                                                                            options.error_feedback))
    return StageExchange(named_params, options.codec, options.error_feedback, transport, group.handle,
                         list(group.devices), group.links)


def _regions_as_replicas(gather: Gather, group: DPGroup, rank: int, prior: Sequence[float] | None
                         ) -> tuple[Gather, int, int, list[float] | None]:
    """Adaptive local steps by regions: (the gather whose rows are the regions', after the members agree on the
    largest value, i.e. the slowest member's seconds; this rank's region; the region count; the prior per region,
    its members' largest)."""
    regions = group.hierarchy.regions  # type: ignore[union-attr]
    region = regions.region_of(rank)
    agreed = site_agreed(gather, group.hierarchy.intra[region])  # type: ignore[union-attr]
    leaders = [group.ranks.index(members[0]) for members in regions.members]  # a region's row: its first member's

    def by_region(mine: torch.Tensor) -> Callable[[], torch.Tensor]:
        wait = agreed(mine)
        return lambda: wait()[leaders]

    per_region = None if prior is None else [max(prior[group.ranks.index(m)] for m in members)
                                             for members in regions.members]
    return by_region, region, regions.count, per_region


def _region_exchange(named_params: list[tuple[str, torch.nn.Parameter]], transport: CollectiveTransport,
                     group: DPGroup, rank: int) -> DPExchange | None:
    """Local SGD with a hierarchy: the full-precision mean over this rank's region (None: flat, or a
    region of one)."""
    if group.hierarchy is None:
        return None
    region = group.hierarchy.regions.region_of(rank)
    if group.hierarchy.intra[region] is None:
        return None
    members = group.hierarchy.regions.members[region]
    return StageExchange(named_params, CodecSpec.uncompressed(), False, transport, group.hierarchy.intra[region],
                         group.devices_of(members))
