"""DiLoCo for any training loop: wrap the model and its inner optimizer, keep the loop as it is.

    dist.init_process_group("gloo")            # plain, under torchrun, `geotrain emulate` or netlab
                                               # (GPUs: "cpu:gloo,cuda:nccl", or no backend; not "nccl" alone)
    with DiLoCo(model, inner_optimizer, sync_every=H, fragments=P, delay=tau, codec="int8-block",
                outer_lr=0.7, outer_momentum=0.9) as diloco:
        for batch in data:
            inner_optimizer.zero_grad()
            loss_fn(model(batch)).backward()
            inner_optimizer.step()             # the outer sync runs from this step's post hook
    # on leaving the block every fragment has synced: all ranks hold the same parameters

The outer synchronisation is geotrain.sync.StreamingOuterSync (the one implementation, also behind
`geotrain train --sync-every`): P fragments on a staggered schedule, each exchange overlapped with
tau inner steps and landing mixed in with `mix` (Streaming DiLoCo's alpha) or eagerly (`landing="eager"`,
after `warmup` blocking steps), outer gradients through any codec of geotrain.codecs with error feedback
(the codec reducer of geotrain.comm). See docs/history/diloco.md.

Regions (`regions=[[0, 1], [2, 3]]`, global ranks per site): each region is one DiLoCo worker, as in
`geotrain train --dp-hierarchical --sync-every`: before every inner step its members average their
gradients at full precision over the region's group (an optimizer step pre-hook), and the outer
gradients go through the hierarchical exchange (full precision inside a region, the codec between
regions; geotrain.comm.hierarchical), posted with a delay, and with moment sync the moments through it too. On sharded
parameters (below) the regions are ranks of `group` (site indices) and apply to every shard position.

Adaptive local steps (`local_steps="adaptive"`, geotrain.sync.adaptive): each replica takes H_r inner steps
per outer period in proportion to its measured speed (H = sync_every is the mean H_r), and the outer mean is
the plain one (every inner step counts alike: geotrain.sync.adaptive); re-balanced at every sync. Ranks then
differ in inner steps, so the loop ends on the outer syncs every rank agrees on:

    with DiLoCo(model, inner_optimizer, sync_every=H, local_steps="adaptive", codec="none") as diloco:
        while diloco.outer_step < N:           # N periods on every rank, the same parameters at the end
            <one inner step>

A replica's speed is the seconds between its inner steps, the syncs left out (`step_s`), by `clock`: wall seconds,
or under the emulating backend (`geotrain emulate`) the rank's emulated clock, so that with --emulate-gpu-speed a
T4 rank counts as a T4 though every rank computes on this machine. A collective the loop runs between steps (a
loss all-reduce) counts too: each step then waits for the slowest replica, and the replicas look equally fast.

One fragment, flat: fragments, moment sync or regions with it are refused; a `delay` overlaps each sync's exchange
with the next period (geotrain.sync.adaptive).

Asynchronous (`asynchronous=True`; geotrain.sync.async_outer): a replica that ends its H inner steps sends
its outer gradient (fp32, no codec) to the global model's server in rank 0's process and goes on from the
model it gets back, without waiting for the others; delayed Nesterov outer momentum, `staleness_bound`;
with `regions` each region's first rank merges its replicas first (after HALoS). Ranks then differ in
step counts: loop `while diloco.outer_step < N` (replica outer gradients in the global model this rank
holds); leaving the block waits until every rank has left: all hold the final global model.
See docs/guide/heterogeneous-sites-async.md.

Sharded replicas (FSDP2 / DTensor parameters, e.g. a site's devices sharding the model with `fully_shard(model,
mesh=mesh["shard"])`): give `group=mesh["replicate"].get_group()`, the same shard's peers at the other sites. Each
rank's outer sync then runs on its local shards (geotrain.optim.shards): anchors, outer momentum and codec
residuals are shard-sized, nothing gathers the model, and each shard averages with its peers. Blocking, fragments
cut by layers (the same on every shard: by the parameters' global sizes), delay and either landing, any codec with
error feedback, adaptive local steps (the site's shards agree on each period's step time: its slowest shard's,
an all-reduce over the parameters' mesh). Moment sync averages the inner AdamW's moments per
local shard too. Asynchronous updates run a global model's server per shard position (on the first rank of
`group`; a site's shards agree on their update count: geotrain.sync.async_outer). Regions are ranks of `group` (site
indices): each shard position averages over its own region groups, the same shard of the region's sites. Refused in
one line: fragments cut by bytes, asynchronous regions, and a group that holds two shards of one parameter
(geotrain.sync.sharded).

Outer state in host memory (`outer_state="host"`, geotrain.optim.outer_state; INTELLECT-1's offload): the anchors,
outer momentum, the exchanged outer gradients and means and moment sync's anchors live on the CPU (pinned when the
parameters are on CUDA), and each sync copies the parameters over one tensor at a time: the device holds the model,
its gradients and the inner optimizer's state only. Every synchronous mode above runs so (sharded: per local shard),
with the same numbers as "device" (bit for bit on the CPU). Asynchronous: its state is a flat tensor beside the
parameters, host by construction when they are on the CPU; "host" with parameters off the CPU is refused. The CUDA
path has not run on a GPU.

Groups: `group=None` is the default process group. Every exchange is posted from the training
thread (async work when tau > 0), so the loop may run its own collectives (a loss all-reduce) on the
same group between them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from geotrain.codecs import CodecSpec
from geotrain.comm.gather import GatherLinks
from geotrain.comm.hierarchical import HierarchicalGroups
from geotrain.comm.regions import Regions
from geotrain.emulate.rank_clock import emulated_clock, start_loop
from geotrain.optim.outer import DILOCO_LR, DILOCO_MOMENTUM, OuterStepError, check_outer_settings
from geotrain.optim.outer_state import check_outer_state
from geotrain.optim.shards import local_shard
from geotrain.sync.adaptive import AdaptiveOuterSync, check_adaptive_settings, gather_floats
from geotrain.sync.async_outer import STALENESS_BOUND, STALENESS_POWER, AsyncOuterSync, check_async_settings
from geotrain.sync.base import ComputeTimer, DPExchange, SyncError, check_host_backend
from geotrain.sync.exchange import DirectTransport, StageExchange
from geotrain.sync.hierarchical import hierarchical_exchange
from geotrain.sync.moments import MomentTensors, moment_parts
from geotrain.sync.sharded import check_sharded_settings, site_agreed
from geotrain.sync.streaming import StreamingOuterSync


class DiLoCo:
    """Streaming DiLoCo around a user's loop (module doc). Outer settings: `sync_every` H inner steps per
    outer period, `fragments` P (1..H), `fragment_split` where they are cut ("layers": between tensors; "bytes":
    at equal bytes, splitting tensors; geotrain.sync.streaming), `delay` tau (0..H-1 steps a sync lands late), `mix` alpha in
    [0, 1], `landing` "mix" (with `mix`) or "eager" (the replica's own outer gradient applied at once as the
    mean's proxy, the correction when the mean lands; geotrain.sync.streaming), `warmup` (syncs started before
    this inner step block), `codec` a codec spec of the outer gradients, `error_feedback` on by default; `gather_links`:
    the group's links (geotrain.comm.gather.GatherLinks, members in group-rank order), so that a gathered
    codec's exchange takes one direct all-to-all round where it is faster than the ring (None: the ring);
    `sync_moments`: each outer sync also averages the inner optimizer's moments (torch's Adam or AdamW;
    geotrain.sync.moments), in the same collective; `moment_syncs` N: only each fragment's first N outer
    syncs carry them (None: every sync); `local_steps` "equal" (H on every replica) or "adaptive" (H_r by
    measured speed: module doc); `step_time` (adaptive): replaces the measured
    seconds per inner step (by `clock`: wall seconds, or the rank's emulated ones under `geotrain emulate`;
    the syncs left out) by what it returns; `prior_step_s` (adaptive): relative
    seconds per step of each rank (group order) that share the first two periods before any time is measured
    (e.g. 1 / each GPU's peak FLOP/s; None: H everywhere). `asynchronous`: outer updates through a global
    model's server without lock-step (module doc), `staleness_bound` S (no update applied more than S versions
    stale: fast replicas wait), `merge_every` (with regions: region updates per merge into the global model;
    None: the region's size), `async_merge` (what the server does to an arriving outer gradient first:
    geotrain.sync.async_merge), `staleness_power` P (an update s versions stale weighs (1 + s) ** -P); not with
    adaptive local steps. `outer_state`: where the outer state (anchors, outer momentum, the exchanged outer gradients,
    moment anchors) lives: "device" (the parameters') or "host" (module doc)."""

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer, *, sync_every: int,
                 fragments: int = 1, delay: int = 0, mix: float = 0.0, landing: str = "mix", warmup: int = 0,
                 codec: str | CodecSpec = "int8-block",
                 error_feedback: bool = True, outer_lr: float = DILOCO_LR, outer_momentum: float = DILOCO_MOMENTUM,
                 group: Any = None, regions: Sequence[Sequence[int]] | None = None,
                 gather_links: GatherLinks | None = None, sync_moments: bool = False,
                 moment_syncs: int | None = None, fragment_split: str = "layers", local_steps: str = "equal",
                 step_time: Callable[[], float] | None = None, prior_step_s: Sequence[float] | None = None,
                 asynchronous: bool = False, staleness_bound: int = STALENESS_BOUND,
                 merge_every: int | None = None, async_merge: str = "staleness",
                 staleness_power: float = STALENESS_POWER, outer_state: str = "device") -> None:
        try:
            check_outer_settings(sync_every, outer_lr, outer_momentum, "DiLoCo")
            check_outer_state(outer_state, "DiLoCo: outer_state")
        except (OuterStepError, ValueError) as exc:
            raise SyncError(str(exc)) from None
        if not dist.is_initialized():
            raise SyncError("DiLoCo needs torch.distributed.init_process_group() first (one process per replica)")
        check_host_backend(dist.get_backend(group), "DiLoCo")
        if not isinstance(sync_moments, bool):
            raise SyncError(f"DiLoCo: sync_moments must be true or false, got {sync_moments!r}")
        check_adaptive_settings(local_steps, fragments=fragments, hierarchical=regions is not None,
                                who="DiLoCo: local_steps")
        trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        shard_group = check_sharded_settings(trained, group, fragments=fragments, fragment_split=fragment_split)
        self.model = model
        self.outer_state = outer_state
        self.inner_optimizer = inner_optimizer
        self.sync_every = sync_every
        self.local_steps = local_steps
        self.asynchronous: AsyncOuterSync | None = None
        if asynchronous:
            if local_steps != "equal":
                raise SyncError(f"DiLoCo: asynchronous outer updates take H inner steps per push on every replica; "
                                f"local_steps must be 'equal', got {local_steps!r}")
            # sharded: `group` is the same shard's peers, a position with its own global model's server
            check_async_settings(fragments=fragments, delay=delay, mix=mix, landing=landing,
                                 group=None if shard_group is not None else group, sync_moments=sync_moments,
                                 gather_links=gather_links)
            if shard_group is not None and regions is not None:
                raise SyncError("DiLoCo on sharded parameters (DTensor): asynchronous regions are not built here "
                                "(each shard position would need its own regions); geotrain train "
                                "--outer-sync async-hierarchical runs them")
            named = [p for p in model.parameters() if p.requires_grad]
            if outer_state == "host" and any(local_shard(p).device.type != "cpu" for p in named):
                raise SyncError("DiLoCo(asynchronous=True): outer_state 'host' is not built for parameters off the CPU "
                                "(the asynchronous sync keeps its flat anchor beside them); use outer_state 'device'")
            position = None if shard_group is None else dist.get_process_group_ranks(group)
            self.asynchronous = AsyncOuterSync(named, sync_every, outer_lr=outer_lr, outer_momentum=outer_momentum,
                                               staleness_bound=staleness_bound, regions=regions,
                                               merge_every=merge_every, merge=async_merge,
                                               staleness_power=staleness_power, position=position,
                                               position_group=None if shard_group is None else group,
                                               replica_group=shard_group)
            regions = None  # the regions are the asynchronous servers', not the every-step gradient mean's
        self.codec = CodecSpec.parse(codec)
        self.transport = DirectTransport()
        self.group = group
        self.error_feedback = error_feedback
        self.gather_links = gather_links
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.exchanges: list[DPExchange] = []
        self.hierarchy = None if regions is None else self._hierarchy(regions, group, shard_group is not None)
        self.region_exchange = None if self.hierarchy is None else self._region_exchange(named)
        self.sync: StreamingOuterSync | AdaptiveOuterSync | None = None  # None: asynchronous (its own exchanges)
        if local_steps == "adaptive":
            replicas = dist.get_world_size(group)
            gather = site_agreed(gather_floats(group, self._gather_floats, gather_links), shard_group)
            self.sync = AdaptiveOuterSync(named, inner_optimizer, self._exchange_of, sync_every, outer_lr,
                                          outer_momentum, gather, dist.get_rank(group), replicas, step_time=step_time,
                                          prior_step_s=prior_step_s, delay=delay, landing=landing, mix=mix,
                                          warmup=warmup, outer_state=outer_state, sync_moments=sync_moments,
                                          moment_syncs=moment_syncs)
        elif self.asynchronous is None:
            self.sync = StreamingOuterSync(named, inner_optimizer, self._exchange_of, sync_every, fragments, delay,
                                           mix, outer_lr, outer_momentum, total_steps=None, landing=landing,
                                           warmup=warmup, sync_moments=sync_moments, moment_syncs=moment_syncs,
                                           fragment_split=fragment_split, outer_state=outer_state)
        self.clock: Callable[[], float] = emulated_clock(group) or time.perf_counter
        """What inner steps are timed by: wall seconds, or under the emulating backend (`geotrain emulate`) this
        rank's emulated clock (compute at its device's speed with --emulate-gpu-speed; geotrain.emulate)."""
        self._mark = self.clock()
        self.step_s = 0.0
        """Seconds by `clock` spent between inner steps (from the end of one to the end of the next, the outer
        syncs left out): this rank's compute, and whatever else its loop does between steps."""
        self.timer = ComputeTimer()
        self.inner_steps = 0
        self.bytes_sent = 0
        """Bytes this rank handed to the outer exchanges' collectives (the codec's payloads)."""
        self.region_bytes = 0
        """Bytes this rank handed to its region's every-step gradient mean (regions only)."""
        self._hook: Any = None
        self._pre_hook: Any = None

    @staticmethod
    def _hierarchy(regions: Sequence[Sequence[int]], group: Any, sharded: bool) -> HierarchicalGroups:
        """The region groups (every rank creates every one, in one order). Unsharded: `regions` are global ranks.
        Sharded (module doc): they are ranks of `group`, the same shard's peers (site indices), and every shard
        position gets its own regions, over its peers' global ranks."""
        if group is not None and not sharded:
            raise SyncError("DiLoCo: give regions or group, not both (regions span the default group)")
        parsed = Regions.of(regions, "DiLoCo regions")
        size = dist.get_world_size(group)
        if sorted(parsed.ranks) != list(range(size)):
            whose = "of group (the same shard's peers)" if sharded else "rank"
            raise SyncError(f"DiLoCo regions must hold every {whose} 0..{size - 1} once, got {regions!r}")
        if not sharded:
            return HierarchicalGroups.create(parsed)
        mine = tuple(dist.get_process_group_ranks(group))
        positions: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(positions, mine)
        made = {peers: HierarchicalGroups.create(Regions.of([[peers[i] for i in region] for region in parsed.members],
                                                            "DiLoCo regions"))
                for peers in sorted(set(positions))}
        return made[mine]

    def _region_exchange(self, named: list[tuple[str, torch.nn.Parameter]]) -> StageExchange | None:
        assert self.hierarchy is not None
        region = self.hierarchy.regions.region_of(dist.get_rank())
        intra = self.hierarchy.intra[region]
        return None if intra is None else StageExchange(named, CodecSpec.uncompressed(), False, self.transport,
                                                        intra, [])

    def _exchange_of(self, named_shadows: list[tuple[str, torch.nn.Parameter]],
                     moments: MomentTensors | None = None) -> DPExchange:
        exchange: DPExchange
        if self.hierarchy is None:
            extra = [] if moments is None else moment_parts(moments, self.codec, self.error_feedback)
            exchange = StageExchange(named_shadows, self.codec, self.error_feedback, self.transport, self.group, [],
                                     self.gather_links, extra)
        else:
            exchange = hierarchical_exchange(named_shadows, self.codec, self.error_feedback, self.transport,
                                             self.hierarchy, dist.get_rank(), [], moments)
        self.exchanges.append(exchange)
        return exchange

    @property
    def declared_bytes(self) -> int | None:
        """What the codec declared for every payload encoded so far (sum of payload.nbytes); None with
        regions (the hierarchical exchange counts what it sent: `bytes_sent`)."""
        if self.hierarchy is not None:
            return None
        return sum(exchange.reducer.declared_bytes for exchange in self.exchanges)  # type: ignore[attr-defined]

    @property
    def outer_step(self) -> int:
        """Outer updates this rank has applied or received: adaptive, the syncs done (the same on every rank
        between syncs); asynchronous, the replica outer gradients in the global model it last received; equal,
        inner_steps // sync_every (with fragments: periods of the last fragment to start, roughly)."""
        if self.asynchronous is not None:
            return self.asynchronous.outer_step
        if isinstance(self.sync, AdaptiveOuterSync):
            return self.sync.outer_step
        return self.inner_steps // self.sync_every

    def _gather_floats(self, wait: Callable[[], Any]) -> Any:
        return self.transport.collective(self.group, [], 8, wait, posted=True)

    def __enter__(self) -> DiLoCo:
        start_loop(self.group)  # emulated: the loop's compute counts at the GPU's speed from here (no collective yet)
        self._mark = self.clock()
        self._hook = self.inner_optimizer.register_step_post_hook(self._after_inner_step)
        if self.region_exchange is not None:
            self._pre_hook = self.inner_optimizer.register_step_pre_hook(self._before_inner_step)
        return self

    def _before_inner_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        assert self.region_exchange is not None
        self.region_bytes += self.region_exchange.exchange(self.inner_steps, self.timer)

    def _after_inner_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.asynchronous is not None:
            self._step_seconds()
            self.asynchronous.after_inner_step()
            self._mark = self.clock()
            self.inner_steps = self.asynchronous.inner_steps
            self.bytes_sent = self.asynchronous.bytes_sent
            return
        assert self.sync is not None
        if isinstance(self.sync, AdaptiveOuterSync):
            self.bytes_sent += self.sync.after_inner_step(self._step_seconds(), self.timer)
        else:
            self._step_seconds()
            self.bytes_sent += self.sync.after_inner_step(self.inner_steps, self.timer)
        self._mark = self.clock()  # the sync just run is left out of the next step's seconds
        self.inner_steps += 1

    def _step_seconds(self) -> float:
        """Seconds by `clock` since the last inner step ended (or the block began), added to `step_s`."""
        seconds = self.clock() - self._mark
        self.step_s += seconds
        return seconds

    def flush(self) -> None:
        """Land every sync in flight and sync every fragment now: all replicas agree afterwards (adaptive: the
        steps since the last sync, if any rank took some; every rank must be in the same period; asynchronous:
        the final exchange, which waits for every rank)."""
        if self.asynchronous is not None:
            self.asynchronous.finish()
            self.bytes_sent = self.asynchronous.bytes_sent
            return
        if isinstance(self.sync, AdaptiveOuterSync):
            self.bytes_sent += self.sync.flush(self.timer)
            return
        assert self.sync is not None
        self.bytes_sent += self.sync.flush(max(self.inner_steps - 1, 0), self.timer)

    def __exit__(self, exc_type: Any, *rest: object) -> None:
        for hook in (self._hook, self._pre_hook):
            if hook is not None:
                hook.remove()
        self._hook = self._pre_hook = None
        if exc_type is None:
            self.flush()
        elif self.asynchronous is not None:
            self.asynchronous.close()
        elif isinstance(self.sync, StreamingOuterSync):
            self.sync.close()

    def fingerprint(self) -> float:
        """A float64 sum of the anchors: the same on every rank when no sync is in flight (asynchronous: of
        the global model this rank last received, the same on every rank after the block)."""
        if self.asynchronous is not None:
            return self.asynchronous.fingerprint()
        assert self.sync is not None
        return self.sync.fingerprint()

    def state_dict(self) -> dict[str, Any]:
        if self.sync is None:
            raise SyncError("DiLoCo(asynchronous=True) does not checkpoint: the global model lives in rank 0's server")
        return {"sync": self.sync.state_dict(), "inner_steps": self.inner_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.sync is None:
            raise SyncError("DiLoCo(asynchronous=True) does not checkpoint: the global model lives in rank 0's server")
        self.sync.load_state_dict(state["sync"])
        self.inner_steps = int(state["inner_steps"])
