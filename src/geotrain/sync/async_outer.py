"""Asynchronous DiLoCo: a replica that ends its H inner steps sends its outer gradient to the global
model's server and goes on from the model it gets back, without waiting for the other replicas.

Where the global model lives: in a server thread of rank 0's process (flat), or, with regions (after
HALoS, 2025), in a server thread of each region's first rank (the region's model, its replicas' updates
merged over the fast links) plus a global server in rank 0's process (first rank of the first region)
that merges the regions' deltas. A region server sends its delta (region model - the global model it
last got) every `merge_every` region updates and adopts the global model it gets back. Both levels use
delayed Nesterov (geotrain.optim.delayed_nesterov) and the staleness bound of
geotrain.sync.async_server; the wire is geotrain.sync.async_wire. On emulated links (`geotrain emulate`,
train's --time-scale) each message is timed by the cluster's links and every server has its own emulated
clock and serves requests in emulated-time order (geotrain.sync.async_timing), so a replica on a slow GPU
sends as rarely as its speed says, though every rank computes on this one machine.

Positions (a run of S > 1 pipeline stages or K > 1 shards per slot: `position`, the ranks of one (stage, shard)
by replica): the global model is split by position, a server per position on its first rank (replica 0's;
"rank 0" above), every rank the client of its position's server only, as a parameter server sharded by position
(DistBelief's Downpour SGD). Each server keeps its own version, staleness bound and weights. A replica's ranks
push at the same inner step (they step in lock-step) and, after each reply, agree in `replica_group` on the least
update count of their positions (`outer_step`: the replica stops as one) and on the largest checkpoint round any
names (it pauses as one); the step a round closes at is agreed by every rank (the largest). On emulated links the
agreements also set each rank's clock to the latest of its group's, and every position's server serves in the order
the first position's decides (async_timing: replicas of several positions). The outer optimizer is elementwise, so
with one arrival order at every position the servers are exactly one whole-model server.

Fragments (`fragments` P > 1, geotrain.sync.async_fragments): each position's server (and region server) is a
server per fragment, and a replica pushes fragment p at streaming DiLoCo's offset p x H // P of its period: each push
and reply carry about M / P.

Costs on the links, per replica update of a model of M fp32 bytes: flat, M up and M down between the
replica and rank 0 (across the WAN for every replica outside rank 0's region); hierarchical, the same
inside the region, and per `merge_every` region updates M up and M down between the region's first rank
and rank 0. The initial model is one broadcast from rank 0.

Failures: the global model exists once, in rank 0's process; if that process or its site fails the run
fails (the launcher tears every rank down, as for any failed rank). A failed replica holds the others
only through the staleness bound (they wait for its update); there is no re-join. Elastic runs
(`--elastic --outer-sync async`) do not use this class: their groups are TCP clients of a server that a
killed client leaves and that is re-elected from the freshest replica when its host dies
(geotrain.runtime.elastic.async_group).

Ending: `outer_step` is the number of replica outer gradients in the model this rank last received
(its own and the others'), so `while outer_step < N` ends on every rank; `finish()` sends what is left
and returns when every rank has finished: all hold the same final global model.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from geotrain.comm.groups import new_group
from geotrain.comm.regions import Regions
from geotrain.cost.async_outer import STALENESS_BOUND, STALENESS_POWER
from geotrain.optim.shards import local_shard
from geotrain.sync.async_fragments import FragmentLayout, FragmentServer
from geotrain.sync.async_moments import (MOMENT_PARTS, flat_moments, load_moments, loads_moments, push_of,
                                         server_optimizer)
from geotrain.sync.async_region import RegionServer
from geotrain.sync.async_server import OuterServer, Reply, Request
from geotrain.emulate.rank_clock import emulating_group
from geotrain.sync.async_timing import LinkTimer, ServeOrder
from geotrain.sync.async_wire import Mailbox, MailboxTiming, ServerThread, own_store_client
from geotrain.sync.base import SyncError
from geotrain.sync.streaming import fragment_due

OUTER_SYNCS = ("sync", "async", "async-hierarchical")
"""`train --outer-sync`: synchronous DiLoCo, asynchronous (flat), asynchronous with region servers."""


def _flat(params: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in params])


def _largest(values: torch.Tensor, group: Any) -> torch.Tensor:
    """`values`, each the largest over process group `group` (None: the default one). On emulated links over the
    emulating group's plain gloo group: an emulated collective holds its process's emulation lock while it waits,
    which would stop the server thread in the same process from replying to the peer it waits for (a deadlock);
    these few bytes of agreement take no emulated time."""
    emulating = emulating_group(group)
    if emulating is None:
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
    else:
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        emulating.inner.allreduce([values], options).wait()
    return values


class AsyncOuterSync:
    """This rank's side of asynchronous DiLoCo (module doc): `after_inner_step()` after each inner step,
    `finish()` at the end. `regions` None: flat; else global ranks per region (hierarchical). `budget`: the
    replica outer gradients the global model takes at most (async_server; None: no cap). `timeout_s`: the
    collective timeout of the groups it creates and the server's own rank's wait for its reply (async_wire; None:
    torch's default, no bound in process; a run gives its --comm-timeout). `merge`:
    what each server does to an arriving outer gradient before its outer optimizer (geotrain.sync.async_merge).
    `position`: the ranks of this rank's position by replica (module doc; None: the world, one position),
    `position_group` their process group (None: the default one), `replica_group` the group of this rank's replica's
    ranks where they agree (None: a replica of one rank). `moments`: the inner AdamW whose second moments the
    servers also merge and every reply sets (geotrain.sync.async_moments; None: each replica's stay its own).
    `fragments` P > 1: streaming DiLoCo's fragments (cut by `fragment_split`), each pushed at its own step offset to a
    fragment server (geotrain.sync.async_fragments; with regions, region servers of fragments too)."""

    _instances = itertools.count()

    def __init__(self, params: Sequence[torch.nn.Parameter], sync_every: int, *, outer_lr: float,
                 outer_momentum: float, staleness_bound: int = STALENESS_BOUND,
                 staleness_power: float = STALENESS_POWER, regions: Sequence[Sequence[int]] | None = None,
                 merge_every: int | None = None, budget: int | None = None,
                 timeout_s: float | None = None, merge: str = "staleness", position: Sequence[int] | None = None,
                 position_group: Any = None, replica_group: Any = None,
                 moments: torch.optim.Optimizer | None = None, fragments: int = 1,
                 fragment_split: str = "layers") -> None:
        if not dist.is_initialized():
            raise SyncError("asynchronous DiLoCo needs torch.distributed.init_process_group() first")
        if fragments > sync_every:
            raise SyncError(f"asynchronous DiLoCo: fragments {fragments} must be at most sync_every ({sync_every}) so "
                            f"that their offsets differ")
        self.params = list(params)
        self.local = [local_shard(p) for p in self.params]  # a sharded slot's parameters: this rank's shards
        self.sync_every = sync_every
        self.budget = budget
        self.rank = dist.get_rank()
        ranks = list(range(dist.get_world_size())) if position is None else list(position)
        if self.rank not in ranks:
            raise SyncError(f"asynchronous DiLoCo: rank {self.rank} is not in its position's ranks {ranks}")
        self.host = ranks[0]
        """The rank hosting this position's global model (its first: replica 0's)."""
        self.replica_group = replica_group
        self.regions = None if regions is None else Regions.of(regions, "asynchronous DiLoCo regions")
        if self.regions is not None and sorted(self.regions.ranks) != sorted(ranks):
            raise SyncError(f"asynchronous DiLoCo regions must hold every rank of {ranks} once, got {regions!r}")
        groups = [ranks] if self.regions is None else [list(r) for r in self.regions.members]
        if self.regions is not None and groups[0][0] != self.host:
            raise SyncError(f"asynchronous DiLoCo: the first region must start with rank {self.host} (the global "
                            f"server), got {regions!r}")
        with torch.no_grad():  # every replica and server of the position starts from its host's model
            for p in self.local:
                dist.broadcast(p, self.host, group=position_group)
        store = c10d._get_default_store()
        # one group per direction of traffic: replicas <-> their server, region servers <-> the global one (every
        # position's servers share them: per process each is used by one thread, module async_wire)
        client_group = new_group(None, timeout_s, backend="gloo")
        global_group = new_group(None, timeout_s, backend="gloo")
        instance = f"geotrain/async/{next(self._instances)}"
        self.moments = moments
        self.replicas = len(ranks)
        self.numel = sum(p.numel() for p in self.local)
        """This position's parameter values: the global model's first part (with moments, their v follows)."""
        self.layout = FragmentLayout.of(self.local, fragments, fragment_split, 1 if moments is None else
                                        1 + MOMENT_PARTS)
        self.ranges, self.wire_ranges = self.layout.ranges, self.layout.wire
        self.anchor = self.layout.laid_out(_flat(self.local) if moments is None else torch.cat(
            [_flat(self.local), torch.zeros(MOMENT_PARTS * self.numel)]))  # moments start at zero, as AdamW's do
        self.sent_to: Counter = Counter()
        numel = self.anchor.numel()
        my_group = next(g for g in groups if self.rank in g)
        self.leader = my_group[0]
        emulating = emulating_group(client_group)
        self.emulation = None if emulating is None else emulating.state
        """This process's emulation (emulated links: messages timed, served in emulated order), else None."""
        server_timer = None
        if self.emulation is not None:
            server_timer = LinkTimer.for_server(self.emulation) if self.rank == self.leader else None
            timing = MailboxTiming(emulating.inner, LinkTimer.of_rank(self.emulation), server_timer)
        self.mailbox = Mailbox(store, f"{instance}/region{self.leader}", self.leader, client_group, numel,
                               self.sent_to, None if self.emulation is None else timing, timeout_s,
                               None if fragments == 1 else [len(r) for r in self.wire_ranges])
        self._publish_clock()
        # on emulated links with several positions, every position's server serves in the order the first
        # position's decides (async_timing.ServeOrder); the first position holds rank 0 (replica 0's first rank)
        ordered = self.emulation is not None and replica_group is not None
        lead = 0 in ranks

        def order(name: str, clients: list[int]) -> ServeOrder | None:
            return ServeOrder(own_store_client(store), f"{instance}/order/{name}", clients, lead) if ordered else None
        self.threads: list[ServerThread] = []
        self.servers: list[OuterServer] = []
        self.region: RegionServer | None = None
        """This rank's region server (hierarchical, on a region's first rank), else None."""
        lr, beta, power, bound = outer_lr, outer_momentum, staleness_power, staleness_bound

        def outer(clients: int, lr: float, beta: float, numel: int = self.numel) -> Any:
            return server_optimizer(merge, clients, lr, beta, power, None if moments is None else numel)

        def server(clients: list[int], lr: float, beta: float, budget: int | None,
                   relay: bool = False) -> OuterServer | FragmentServer:
            """A global (or region) model's server: with fragments, one per fragment (async_fragments)."""
            if fragments == 1:
                return OuterServer(self.anchor, outer(len(clients), lr, beta), clients, bound, budget, relay=relay)
            return FragmentServer(self.anchor, self.wire_ranges, [outer(len(clients), lr, beta, len(r))
                                                                  for r in self.ranges],
                                  clients, bound, budget, relay=relay, replicas=len(ranks))

        def ended(server: OuterServer | FragmentServer) -> Callable[[], bool]:
            if isinstance(server, FragmentServer):
                return server.finished
            return lambda: not server.base and not server.done
        if self.rank == self.leader:
            region_server = server(my_group, lr, beta, budget if self.regions is None else None,
                                   relay=self.regions is not None)
            self.servers.append(region_server)
            handle = region_server.submit
            publish = None
            if self.regions is not None:
                upstream_timing = None
                if server_timer is not None:  # emulated links
                    upstream_timing = MailboxTiming(emulating_group(global_group).inner, server_timer,
                                                    LinkTimer.for_server(self.emulation)
                                                    if self.rank == self.host else None)
                upstream = Mailbox(store, f"{instance}/global{self.host}", self.host, global_group, numel,
                                   self.sent_to, upstream_timing, timeout_s,
                                   None if fragments == 1 else [len(r) for r in self.wire_ranges])
                if self.rank == self.host:
                    leaders = [g[0] for g in groups]
                    # the regions already applied the outer optimizer: the global server averages their
                    # deltas (lr 1, no momentum, 1/R each), so a replica's update weighs as in the flat run
                    top = server(leaders, 1.0, 0.0, budget)
                    self.servers.append(top)
                    self.threads.append(ServerThread(upstream, top.submit, ended(top), top.senders,
                                                     order=order("global", leaders)))
                region = RegionServer(region_server, upstream, self.rank, merge_every or len(my_group), server_timer)
                self.region, handle = region, region.handle
                if upstream_timing is not None:  # the global server's bound on this region's next request
                    upstream.client_board.publish(self.rank, 0.0)
                    publish = functools.partial(upstream.client_board.publish, self.rank)
            self.threads.insert(0, ServerThread(self.mailbox, handle, ended(region_server),
                                                region_server.senders, publish,
                                                order(f"region{groups.index(my_group)}", my_group)))
        for thread in self.threads:
            thread.start()
        self.version = 0
        self.versions = [0] * len(self.ranges)
        """The version of each fragment this rank last received (its base for that fragment's next push)."""
        self.since = [0] * len(self.ranges)
        """Inner steps since each fragment's last push (0: nothing to send)."""
        self.last_pushed = len(self.ranges) - 1
        self.outer_step = 0
        """Replica outer gradients in the global model this rank last received (its own and the others')."""
        self.pushes = 0
        """Outer gradients this rank sent."""
        self.model_time_s = 0.0
        """On emulated links: the emulated second the model this rank last received left its server (its time as
        the global model; the rank holds it one link later)."""
        self.inner_steps = 0
        self.period_steps = 0
        self.finished = False
        self.exchange_s = 0.0
        """Seconds this rank spent blocked in its exchanges with its server (request out to reply in): emulated
        seconds on emulated links (the reply's arrival less the request's hand-off), else wall seconds."""
        self.checkpointed = 0
        """The step of the last checkpoint round this rank paused for (async_server: checkpoint rounds)."""
        self.moments_loaded = 0
        """Replies whose global moments this rank loaded into its AdamW (async_moments.loads_moments)."""
        self.paused_for: int | None = None
        """The checkpoint round's step this rank was just told to go on from: it writes the checkpoint now."""

    @property
    def bytes_sent(self) -> int:
        """Bytes this process put on links (requests and, on a server's rank, replies)."""
        return sum(self.sent_to.values())

    def _publish_clock(self) -> None:
        """On emulated links: tell this rank's server how far its clock is (async_timing: the serving order)."""
        if self.emulation is not None:
            with self.emulation.lock:
                now = self.emulation.clock.now()
            self.mailbox.client_board.publish(self.rank, now)

    def after_inner_step(self) -> None:
        self.inner_steps += 1
        self.period_steps += 1
        self.since = [n + 1 for n in self.since]
        fragments = len(self.ranges)
        if fragments == 1:
            due = [0] if self.period_steps >= self.sync_every else []
        else:  # streaming's offsets (fragments <= sync_every: at most one is due)
            due = [p for p in range(fragments) if fragment_due(self.inner_steps - 1, p, fragments, self.sync_every)]
        if due:
            self._push(final=False, fragment=due[0])
        else:
            self._publish_clock()

    def _exchange(self, request: Request) -> Reply:
        """Send `request`, block for the reply; on emulated links this rank's clock becomes the reply's arrival.
        Adds the exchange's seconds to `exchange_s`."""
        if self.emulation is None:
            started = time.perf_counter()
            reply = self.mailbox.request(self.rank, request)[0]
            self.exchange_s += time.perf_counter() - started
            return reply
        state = self.emulation
        with state.lock:
            held = state.clock.hold()
        reply, arrival = self.mailbox.request(self.rank, request, held[0])
        with state.lock:
            state.clock.finish(held, arrival)
        self.exchange_s += max(0.0, arrival - held[0])
        self._publish_clock()
        return reply

    def _held(self) -> torch.Tensor:
        """What this rank holds now, laid out as the global model: its parameters (and its AdamW's second moments)."""
        if self.moments is None:
            return _flat(self.local)
        return torch.cat([_flat(self.local), flat_moments(self.moments, self.params)])

    def _push(self, final: bool, fragment: int = 0) -> None:
        """Push `fragment`'s outer gradient (the whole model's with one fragment), adopt what comes back."""
        part, wire = self.ranges[fragment], self.wire_ranges[fragment]
        if (self.period_steps if len(self.ranges) == 1 else self.since[fragment]) == 0:
            gradient = None
        else:
            held = self._held()
            held = self.layout.laid_out(held)[wire.start:wire.stop]
            anchor = self.anchor[wire.start:wire.stop]
            gradient = anchor - held if self.moments is None else push_of(anchor, held, len(part))
        reply = self._exchange(Request(self.rank, self.versions[fragment], gradient, 1, final, fragment=fragment))
        self.pushes += gradient is not None
        self.period_steps = 0
        self.since[fragment], self.last_pushed = 0, fragment
        if final and not reply.final:  # a fragment's final push acknowledged (async_fragments): the end comes later
            return
        self.model_time_s = reply.sent_s
        moments = None  # with moment sync: this rank's v as the reply sets it
        if reply.final or len(self.ranges) == 1:
            self.anchor = reply.model
            values = self.layout.standard(reply.model)
            if self.moments is not None:
                moments = values[self.numel:]
            self._adopt(values, 0)
        else:
            self.anchor[wire.start:wire.stop] = reply.model
            self._adopt(reply.model[:len(part)], part.start)
            if self.moments is not None and self.inner_steps:  # this fragment's v in this rank's whole v
                moments = flat_moments(self.moments, self.params)
                moments[part.start:part.stop] = reply.model[len(part):]
        if not reply.final or len(self.ranges) == 1:
            self.versions[fragment] = reply.version
        self.version = self.versions[0]
        if moments is not None and self.inner_steps and loads_moments(reply.updates, self.replicas):
            load_moments(self.moments, self.params, moments)
            self.moments_loaded += 1
        if final:
            self.outer_step = reply.updates
            return
        if fragment:  # the count and the checkpoint rounds come with fragment 0's replies (the period's end)
            reply = dataclasses.replace(reply, updates=self.outer_step, checkpoint=0)
        # a replica of several positions agrees on its count (it stops as one) and on a checkpoint round (it
        # pauses as one): the smallest count and the largest round of its positions' servers
        self.outer_step, round_step = self._agreed(reply.updates, reply.checkpoint)
        if round_step > self.checkpointed:  # a checkpoint round is open: pause for it
            went = self._exchange(Request(self.rank, self.version, None, 0, pause=True, round=round_step))
            step = went.checkpoint if self.replica_group is None else self._world_step(went.checkpoint)
            self.checkpointed = self.paused_for = step  # the step the round closed at

    def _adopt(self, values: torch.Tensor, start: int) -> None:
        """Set this rank's parameters at flat positions start.. (its layout of the global model) to `values`."""
        stop = start + min(values.numel(), self.numel - start)
        with torch.no_grad():
            offset = 0
            for p in self.local:
                lo, hi = max(start, offset), min(stop, offset + p.numel())
                if lo < hi:
                    p.data.view(-1)[lo - offset:hi - offset].copy_(values[lo - start:hi - start].to(p.dtype))
                offset += p.numel()

    def _agreed(self, updates: int, round_step: int) -> tuple[int, int]:
        """(the least `updates`, the largest `round_step`) over this rank's replica (its own without one)."""
        if self.replica_group is None:
            return updates, round_step
        both = self._largest_with_clock([-updates, round_step], self.replica_group)
        return -int(both[0]), int(both[1])

    def _largest_with_clock(self, values: list[int], group: Any) -> list[float]:
        """`values`, each the largest over `group` (exact integers below 2^53); on emulated links the ranks also
        agree on the time: each clock becomes the latest of the group's (a rank waits for its partners' replies)."""
        state = self.emulation
        if state is None:
            return [float(v) for v in _largest(torch.tensor(values, dtype=torch.float64), group)]
        with state.lock:
            held = state.clock.hold()
        agreed = _largest(torch.tensor([*values, held[0]], dtype=torch.float64), group)
        with state.lock:
            state.clock.finish(held, float(agreed[-1]))
        self._publish_clock()
        return [float(v) for v in agreed[:-1]]

    def _world_step(self, step: int) -> int:
        """The step a checkpoint round closed at, agreed by every rank (each position's server closes its own
        round, and may reach a later pause than another's meanwhile): the largest; the rounds through it are
        closed on this rank's server. Every rank is paused in the round when it calls this (no request out)."""
        step = int(self._largest_with_clock([step], None)[0])
        for server in self.servers:
            server.close_through(step)
        return step

    def plan_checkpoints(self, pauses: Sequence[tuple[int, int]]) -> None:
        """The run's checkpoint rounds, (updates, step) pairs (async_server), on the rank hosting the flat server or
        a region's server (hierarchical: the regions open the rounds, async_region)."""
        if self.servers:
            self.servers[0].plan_pauses(pauses)

    @property
    def global_server(self) -> OuterServer | None:
        """The global model's server (of this rank's position) if this rank hosts it, else None."""
        return self.servers[-1] if self.rank == self.host else None

    def state_dict(self) -> dict[str, Any]:
        """This client's place (the model it holds and its version, its counts; its period's start: a checkpoint
        round pauses it there), on rank 0 the global server's state, on a region's first rank its region server's."""
        if self.period_steps:
            raise SyncError(f"asynchronous DiLoCo: state_dict {self.period_steps} steps into a period (checkpoints "
                            f"are taken in a checkpoint round, at a period's start)")
        server = {} if self.global_server is None else {"server": self.global_server.state_dict()}
        if self.region is not None:
            server["region"] = self.region.state_dict()
        return {"anchor": self.anchor.clone(), "version": self.version, "outer_step": self.outer_step,
                "pushes": self.pushes, "inner_steps": self.inner_steps, "model_time_s": self.model_time_s,
                "exchange_s": self.exchange_s, "checkpointed": self.checkpointed,
                "moments_loaded": self.moments_loaded, "versions": list(self.versions), "since": list(self.since),
                "last_pushed": self.last_pushed, **server}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["anchor"].shape != self.anchor.shape:
            raise ValueError(f"checkpoint's global model has {state['anchor'].numel()} values, this one "
                             f"{self.anchor.numel()}")
        self.anchor = state["anchor"].clone()
        self.version, self.outer_step = int(state["version"]), int(state["outer_step"])
        self.pushes = int(state["pushes"])
        self.inner_steps, self.checkpointed = int(state["inner_steps"]), int(state["checkpointed"])
        self.moments_loaded = int(state.get("moments_loaded", 0))
        self.versions = [int(v) for v in state.get("versions", [self.version])]
        self.since = [int(n) for n in state.get("since", [0] * len(self.ranges))]
        self.last_pushed = int(state.get("last_pushed", len(self.ranges) - 1))
        if len(self.versions) != len(self.ranges) or len(self.since) != len(self.ranges):
            raise ValueError(f"checkpoint's asynchronous run has {len(self.versions)} fragments, this one "
                             f"{len(self.ranges)}")
        self.model_time_s, self.exchange_s = float(state["model_time_s"]), float(state["exchange_s"])
        if ("server" in state) != (self.global_server is not None) or ("region" in state) != (self.region is not None):
            raise ValueError("checkpoint and run disagree on which rank hosts the global model's or a region's server")
        if self.global_server is not None:
            self.global_server.load_state_dict(state["server"])
        if self.region is not None:
            self.region.load_state_dict(state["region"])

    def finish(self) -> None:
        """Send what is left (final) and wait until every rank has: all hold the final global model."""
        if self.finished:
            return
        self.finished = True
        fragments = len(self.ranges)
        for _ in range(fragments):  # every fragment's final push, cyclically on from the last pushed
            self._push(final=True, fragment=(self.last_pushed + 1) % fragments)
        for thread in self.threads:
            thread.join()
            if thread.error is not None:
                raise SyncError(f"asynchronous DiLoCo server failed: {thread.error!r}") from thread.error

    def close(self) -> None:
        """Stop this process's server threads without the final exchange (after an error)."""
        for thread in self.threads:
            thread.stopped.set()

    def fingerprint(self) -> float:
        return float(self.layout.standard(self.anchor)[:self.numel].double().sum())

    def stats(self) -> dict[str, Any]:
        """Counters of this rank (and of the servers it hosts)."""
        return {"outer_step": self.outer_step, "pushes": self.pushes, "inner_steps": self.inner_steps,
                "moments_loaded": self.moments_loaded,
                "bytes_sent": self.bytes_sent, "sent_to": dict(self.sent_to),
                "max_staleness": [s.max_staleness for s in self.servers],
                "discarded": [s.discarded for s in self.servers],
                "served_s": [thread.served_s for thread in self.threads]}


def check_async_settings(*, fragments: int, delay: int, mix: float, landing: str, group: Any, sync_moments: bool,
                         gather_links: Any) -> None:
    """SyncError naming the first DiLoCo setting that asynchronous outer updates do not combine with."""
    unsupported = (("fragments", fragments, 1), ("delay", delay, 0), ("mix", mix, 0.0), ("landing", landing, "mix"),
                   ("group", group, None), ("sync_moments", sync_moments, False), ("gather_links", gather_links, None))
    for name, value, default in unsupported:
        if value != default:
            raise SyncError(f"DiLoCo(asynchronous=True): {name} must be {default!r} (whole-model updates through the "
                            f"global model's server, on the default group), got {value!r}")
