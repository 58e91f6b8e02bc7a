"""One process of a replica group of an elastic asynchronous run (`train --elastic --outer-sync async`): a client of
the global model's server (S x K > 1: of its position's: Positions below), and its host while elected. No torchft
collective spans the groups.

Why not torchft: a torchft recovery copies a live peer's state at a synchronous step; asynchronous DiLoCo has
no such step, and every group only talks to the global model's server. So the groups talk over TCP
(geotrain.sync.async_socket), which survives either end's death, and agree on who hosts the server through
the launcher's store (keys under `async/`). Only a closed or refused connection (the host's process is gone) starts
an election; a host that is alive but gives no reply within --comm-timeout ends the waiting group (exit 1: the
launcher restarts it, and it joins the same host), never a second host. The launcher's supervisor restarts a killed group as in every
elastic run (runtime/elastic/launch.py); a restarted group joins as a new client (a request with no gradient
gets it the current model, and it trains on from the run's progress, with a fresh inner AdamW).

The host survives its own loss by re-election from the freshest replica (a standby copy would cost a second
model's traffic per update; every client already holds the last model it received; the election and a client's
link: runtime/elastic/elected.py, shared with the two tiers of `async-hierarchical`, async_regions.py). Every client
keeps that model, its version and update count. Epoch 0's host is group 0. A client that loses the server of
epoch e (HostLost) votes for epoch e + 1 in the store: its copy's (version, updates) (a restarted group with no
copy votes too, without a copy: it counts for the quorum and cannot win). Once max(--min-replicas, R - 1) votes
are in, or the grace window (--heartbeat-timeout seconds: a group that did not vote by then counts as lost) has
passed with at least --min-replicas votes, the first voter to decide writes the winner (highest version; ties:
lowest group) with compare_set, so all read one answer. The winner serves from its copy (OuterServer.start_from:
version, updates, per-client applied counts, and the bases of the clients still running, so the staleness bound holds as
at the lost server: every reply carries each running client's base and process, and the winner restores those of the
clients alive, not the lost host's nor one the launcher restarted or put down, and lets a restored one go if its process
dies before it connects: elected.serve_restored; the outer momentum restarts from zero: it is not carried in replies,
which would double their size) and publishes its address; the others connect to it and resend the
request the lost server did not answer: a gradient with its old base (its staleness counts against the new
server's version), dropped if the copy already holds it (async_socket). Fewer votes than --min-replicas
within the window end the group with its one line (exit 2).

Links (--time-scale F > 0; runtime/elastic/links.py SocketPacing): each request and reply takes the emulated time of
one message alone on the links between this group's device and the current host's (latency + bytes / bandwidth, the
emulator's point-to-point time), slept by this group, the client, in wall time x F: the request before it leaves (it
reaches the server when it would arrive, so the server applies the updates of groups behind slow links later) and
the reply once it came (the server's threads never sleep). The group's records count both messages' bytes
(`sent_bytes`, `inter_region_bytes`) and emulated seconds (`link_s`); the final exchange's go into its last record.
--emulate-gpu-speed at any F: each step's compute is slept out to the group's GPU speed in wall time (not x F: at
F = 1 wall time is the emulated cluster's; below 1 the links shrink against the compute, as in every emulated run).

Partitions (--chaos partition:..., any time scale; links.CutHold): the launcher cuts a group's device in the link state
(links.CUT_KEY), and each message whose either end's device is cut waits, at its client, in wall time until the heal
(before the request leaves, before the reply is taken), as TCP would retransmit; the records count the wait
(`cut_wait_s`). A cut host is alive: no connection closes, so no one is elected and the run stays one model. Its own
client crosses no link and trains on until the staleness bound holds it behind the cut clients. A wait past
--comm-timeout ends the waiting group as a silent host does (exit 1: restarted, it joins again after the heal; its
closed connection releases the bound); the host's own client, held at the bound that long first, ends too.

Lost updates: the model's update count the lost server reached (published in the store after each update)
less the copy's; outer gradients applied after the freshest copy left that no client received. Their own
clients resend those whose reply never came, so what is lost for good is at most that count (the summary's
`lost_updates`, with `elections` and `resent_updates`).

Ending: a group trains while the global model it last received holds fewer than the run's budget of replica
outer gradients (geotrain.sync.async_step.run_budget), then sends its final request; the server replies to the
finals once every connected client has sent its own (a dead client's connection is gone: not waited for), so
every group ends on the same model. The host then marks the run ended in the store and waits for its clients to
close before it exits; a group restarted so late that it finds the server gone and the run ended finishes with
the final model if its join got it, else writes no results (not in the summary's finished groups).

Moments (--sync-moments; sync/async_moments.py): every server's buffer, push, reply and copy is [parameters | AdamW's
second moments v], as without --elastic: a push carries the outer gradient and the group's v, the server merges v
(MomentMerge), a reply's v goes into the group's AdamW once the model holds R replica outer gradients (not at a
restarted group's join: its AdamW has not stepped). So a host elected from its copy serves that copy's global v.

Fragments (--fragments P > 1; sync/async_fragments.py; async-hierarchical's region servers: async_regions.py): the host
serves a FragmentServer (one outer server per fragment behind its one lock, so one serving order: the non-elastic
deadlock argument holds) and a group pushes fragment p's outer gradient at streaming's offset p x H // P of its period
(streaming.fragment_due) and adopts that fragment only; its finals go cyclically from the fragment after its last push.
Clients come and go as without fragments: a join carries the client's base in every fragment (None where its final push
is in), a closed connection leaves every fragment. The copy (runtime/elastic/fragment_copy.py) holds each fragment as of
the group's last reply of it (values, version, count, applied counts, the running clients' bases there); an election
votes on fragment 0's version and the winner starts each fragment's server from that fragment's part of its copy, so no
fragment is older than the winner's last reply of it, and a resent push is dropped when its fragment's applied count
shows the copy holds it (the reply is then that fragment now: the group's other fragments keep their progress). Lost for
good: what the lost host applied beyond the copy, per fragment (`lost_updates` counts fragment 0's). With --sync-moments
each fragment is its parameters then their v (FragmentLayout). Each fragment's outer momentum restarts at an election,
as the whole model's does.

Positions (a plan of S > 1 stages or K > 1 shards per slot: a group is S x K processes, runtime/elastic/stage.py, the
launcher killing and restarting them as one): the global model is split by position (s, k), as without --elastic
(sync/async_outer.py, Positions): every position of the host group serves its position's part from its own copy, and
position (s, k) of every group is a client of that server only (its tier's keys under `async/position<rank>/`, position
(0, 0)'s under `async/`). The group's processes train the same step on their rows of the group's batch (FSDP2 shards:
runtime/sharded.py shard_rows; stages: the pipeline), push at the same inner step, and after the join and each
exchange agree in the group's own gloo group (over its own TCPStore, as the synchronous groups of S x K processes
have) on the least update count of their positions (runtime/elastic/async_positions.py): they take one learning rate and stop as one. One election picks
the host group for every position: position (0, 0) votes for the group with the least of its positions' copy versions
(each other position publishes its copy's after every reply; elected.group_vote), the other positions' tiers follow
its decision (elected.Tier.follows: counted once, in `elections`), so a lost host group is replaced by one group whose
every position serves from its own copy (`lost_updates` and `resent_updates` sum over the positions). A restarted
group's copy wins no election until every position of it has joined (ElectedLink.votes_copy). Checkpoints: each
position's server writes its shard (async_checkpoint.py). Emulated links: each position paces its own messages, and
the group's own groups run on the emulating backend (links.install_group_links). --sync-moments: each position's
server, push, reply, copy and shard is [its parameters | their v] (AdamW's state of its FSDP2 shards: their local
part). --fragments P: each position's server is a FragmentServer of its own part's P fragments (FragmentLayout of its
local shards), every position pushing fragment p at the same offsets. async-hierarchical (async_regions.py): each
position is the client of its region's server for its position, whose host pushes to the same position's global
server; both tiers follow position (0, 0)'s elections (client_tier, position_tier).

Checkpoints (--checkpoint-every, --stop-after, --resume; runtime/elastic/async_checkpoint.py): the host's server
writes one copy after the update that reaches a due step's count; a resumed launch's groups all start holding the
checkpoint's model (group 0 serves it with the saved outer momentum), and --stop-after lowers the launch's budget
to its step's count (the run's end above: the groups end there on one model).
"""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from geotrain.models import lr_at
from geotrain.observe.observer import open_elastic_observer
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.async_positions import GroupPositions, position_prefix
from geotrain.runtime.elastic.async_checkpoint import ServerCheckpoints, launch_budget, launch_start
from geotrain.runtime.elastic.checkpoint import save_group_checkpoint
from geotrain.runtime.elastic.elected import ElectedLink, HeldModel, RunEnded, Tier, serve_counting, serve_restored
from geotrain.runtime.elastic.group import open_group_store, params_digest
from geotrain.runtime.elastic.links import GroupNet, cut_hold, install_group_links, process_device, socket_pacing
from geotrain.runtime.elastic.stage import GroupStageModel, group_position, group_size, pipeline_group
from geotrain.runtime.sharded import shard_rows
from geotrain.optim.shards import local_shard
from geotrain.runtime.elastic.summary import FINAL_KEY, params_path, summary_path
from geotrain.runtime.slowdown import SlowDown, gpu_speed_faults
from geotrain.runtime.training_data import load_training_data
from geotrain.sync.async_moments import (MOMENT_PARTS, flat_moments, load_moments, loads_moments, push_of,
                                         server_optimizer)
from geotrain.sync.async_fragments import FragmentLayout, FragmentServer
from geotrain.sync.async_server import OuterServer
from geotrain.sync.async_socket import SocketServer
from geotrain.sync.async_step import progress_steps
from geotrain.sync.streaming import fragment_due
from geotrain.sync.base import ComputeTimer
from geotrain.sync.factory import BETAS, WEIGHT_DECAY
from geotrain.cost.async_outer import STALENESS_BOUND

__all__ = ["AsyncElasticGroup", "RunEnded"]


def _flat(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The parameters this process holds (a sharded slot's: its shards), flat fp32."""
    return torch.cat([local_shard(p).reshape(-1).to(torch.float32) for p in params])



class AsyncElasticGroup:
    """Replica group `group` of an elastic asynchronous run (module doc); `store`: the launcher's store;
    `incarnation`: this start of the group (0: the first); `authkey`: the run's (its identity digest: a process of
    another run cannot talk to its server); `rank`: this process's group rank, stage x K + shard (module doc:
    Positions)."""

    def __init__(self, config: RuntimeConfig, group: int, store: Any, net: GroupNet, incarnation: int,
                 authkey: bytes, world: Any = None, rank: int = 0) -> None:
        self.config, self.group, self.store, self.net, self.incarnation = config, group, store, net, incarnation
        self.rank, self.position, self.size = rank, group_position(config, rank), group_size(config)
        self.positions = GroupPositions(store, group, incarnation, rank, self.size)
        self.group_store = None
        if self.size > 1:  # the group's own gloo group: its pipeline, FSDP2 and where its positions agree
            self.group_store = open_group_store(config, store, net, group, rank, incarnation)
            self.inside = install_group_links(config, group)  # --time-scale > 0: on its devices' emulated links
            pipeline_group(self.group_store, rank, self.size, config.reliability.comm_timeout_s)
        self.data = load_training_data(config.data.data, config.data.data_seed, config.data.val_fraction, world,
                                       config.data.windows, config.data.epoch_windows)
        self.seq_len = config.sequence_length
        self.timer = ComputeTimer()
        # --emulate-gpu-speed: each step's compute slept out to the group's GPU speed in wall time, at any time scale
        # (no emulated clock counts it here; the links' times are slept x the time scale: module doc)
        self.slowdown = SlowDown(gpu_speed_faults(config.compute_scale(), process_device(config, group, rank), group),
                                 self.timer, None)
        self.model = GroupStageModel(config, self.position, self.data.vocab_size, self.seq_len, self.timer)
        self.params = self.model.params
        self.optimizer = torch.optim.AdamW(self.params, lr=config.optim.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
        self.options = config.sync_options(0)
        self.sync_every: int = config.optim.sync_every  # type: ignore[assignment]
        self.numel = sum(local_shard(p).numel() for p in self.params)
        self.moments_after = self.numel if config.optim.sync_moments else None
        """--sync-moments: the model's values before its second moments (every server's buffer, push, reply and copy
        is [parameters | v]: sync/async_moments.py); None: the parameters only."""
        self.layout = FragmentLayout.of([local_shard(p) for p in self.params], config.optim.fragments, config.optim.fragment_split,
                                        1 if self.moments_after is None else 1 + MOMENT_PARTS)
        """--fragments P: the global model's fragments as every server and copy lays them out (module doc:
        Fragments); one fragment: the whole model, as [parameters | v]."""
        self.moments_loaded = 0
        """Replies whose global second moments this group loaded into its AdamW (async_moments.loads_moments)."""
        self.resumed = launch_start(config, store, incarnation, self.position)
        """--resume: the checkpoint's step, model and server state (runtime/elastic/async_checkpoint.py)."""
        self.stop, self.budget = launch_budget(config, self.resumed.step)
        """The step this launch ends at (--stop-after) and the replica outer gradients the model takes by then."""
        self.checkpoints = ServerCheckpoints(config, group, self.model.module, self.model.boundaries,
                                             self.resumed.step, self.stop,
                                             (self.resumed.step,) if config.checkpoint.resume else (), rank, self.size)
        self.authkey = authkey
        self.timeout_s = config.reliability.comm_timeout_s
        # a fresh run's groups all start from the seed's model (version 0), a resumed run's from the checkpoint's;
        # a restarted one holds nothing yet
        held = HeldModel(None) if incarnation > 0 else \
            self.resumed.held or HeldModel(self._laid_out(_flat(self.params)))
        if held is self.resumed.held:  # the checkpoint's model is [parameters | v]: as this run lays it out
            held = dataclasses.replace(held, model=self.layout.laid_out(held.model))
        self.pacing = socket_pacing(config, group, rank)
        """This process's emulated links (None: --time-scale 0)."""
        self.cuts = cut_hold(config)
        """A partition's hold on this process's messages (None: no partition in --chaos)."""
        self.device = process_device(config, group, rank)
        self.link = self.elected_link(store, self.client_tier(), group, held, self._serve, incarnation == 0)
        """This process's link to its server (its position's global model's; with regions, its region's)."""
        # a restarted group of several processes: its copy wins no election until every position holds one; the group
        # votes with its stalest position's copy
        self.link.votes_copy = self.size == 1 or incarnation == 0
        if rank == 0 and self.size > 1:
            self.link.group_versions = self.positions.versions
        self.observer = open_elastic_observer(config, group, 0, incarnation)
        self.records: list[dict[str, Any]] = []
        self.missed_end = False
        """Restarted after the run ended, before it held the final model: it writes no results."""

    @property
    def held(self) -> HeldModel:
        return self.link.held

    def tier(self, prefix: str, electorate: tuple[int, ...], first_host: int) -> Tier:
        """A tier of this run's servers (runtime/elastic/elected.py) with its reliability settings."""
        rel = self.config.reliability
        return Tier(prefix, electorate, first_host, rel.min_replicas, rel.heartbeat_timeout_s, self.timeout_s,
                    self.authkey)

    def client_tier(self) -> Tier:
        """The tier this process is a client of: its position's part of the global model (module doc: Positions)."""
        return self.position_tier("", tuple(range(self.config.replicas)), 0)

    def position_tier(self, tail: str, electorate: tuple[int, ...], first_host: int) -> Tier:
        """tier(...) of this process's position under `position_prefix(rank) + tail`; a position other than (0, 0)
        follows (0, 0)'s tier of the same `tail` (its elections pick every position's host: module doc, Positions)."""
        return dataclasses.replace(self.tier(position_prefix(self.rank) + tail, electorate, first_host),
                                   follows=None if self.rank == 0 else position_prefix(0) + tail)

    def elected_link(self, store: Any, tier: Tier, client: int, held: HeldModel, serve: Any,
                     fresh: bool) -> ElectedLink:
        """This process's link as `client` of `tier` (elected.ElectedLink), with its device's links and partitions."""
        return ElectedLink(store, tier, client, held, serve, fresh, (self.group, self.incarnation), self.pacing,
                           self.device, self.cuts, self.layout.wire if self.fragmented else ())

    @property
    def fragmented(self) -> bool:
        """--fragments P > 1: the global model's server is a FragmentServer (module doc: Fragments)."""
        return len(self.layout.ranges) > 1

    # --- the host -----------------------------------------------------------------------------------------------
    def _serve(self, epoch: int) -> SocketServer:
        """Host the global model from this group's copy for `epoch`, publishing the lost updates."""
        outer = self.options.outer
        return self.serve_global(self.link.tier, epoch, self.held, self.config.replicas, outer.outer_lr,
                                 outer.outer_momentum)

    def serve_global(self, tier: Tier, epoch: int, held: HeldModel, period: int, lr: float,
                     momentum: float) -> SocketServer:
        """Host the global model (`tier`) from copy `held` for `epoch` (outer optimizer: `period` arrivals per
        momentum update, `lr`, `momentum`) with the bases of its live clients, publishing the lost updates."""
        assert held.model is not None
        options = self.options.heterogeneity

        def outer(numel: int) -> Any:
            return server_optimizer(options.async_merge, period, lr, momentum, options.async_staleness_power,
                                    None if self.moments_after is None else numel)
        saved = self.resumed.optimizer if epoch == 0 else None  # a resumed run's first host: the checkpoint's momentum
        server: OuterServer | FragmentServer
        if self.fragmented:
            optimizers = [outer(len(r)) for r in self.layout.ranges]
            for optimizer, state in zip(optimizers, (saved or {}).get("fragments", ())):
                optimizer.load_state_dict(state)
            server = FragmentServer(held.model, self.layout.wire, optimizers, [], STALENESS_BOUND, self.budget,
                                    replicas=self.config.replicas)
        else:
            optimizer = outer(self.numel)
            if saved is not None:
                optimizer.load_state_dict(saved)
            server = OuterServer(held.model, optimizer, [], STALENESS_BOUND, self.budget)
        return serve_restored(self.store, tier, epoch, held, server, lambda: serve_counting(
            self.store, tier.prefix, epoch, server, held.updates, self.net.advertise, self.authkey,
            after_update=self.checkpoints.writer(self.store, server, self.layout.standard, tier.prefix)))

    def _laid_out(self, flat: torch.Tensor) -> torch.Tensor:
        """A model of `flat` parameters as every server holds it: with --sync-moments, zero second moments after them
        (as a fresh AdamW's); with fragments, laid out fragment by fragment (FragmentLayout)."""
        return self.layout.laid_out(flat if self.moments_after is None else
                                    torch.cat([flat, torch.zeros(MOMENT_PARTS * self.numel)]))

    def _outer_gradient(self, fragment: int = 0) -> torch.Tensor:
        """This group's push of `fragment` (the whole model's with one) since the model it holds (`held`): the outer
        gradient, and with --sync-moments its AdamW's second moments themselves (async_moments.push_of)."""
        anchor = self.held.model
        assert anchor is not None
        wire, part = self.layout.wire[fragment], self.layout.ranges[fragment]
        anchor, now = anchor[wire.start:wire.stop], _flat(self.params)[part.start:part.stop]
        if self.moments_after is None:
            return anchor - now
        # a fragment's wire is its parameters, then their v (FragmentLayout)
        return push_of(anchor, torch.cat([now, flat_moments(self.optimizer, self.params)[part.start:part.stop]]),
                       len(part))

    def _adopt(self, reply: dict[str, Any], final: bool = False) -> None:
        """Take the reply's model as this group's parameters (with fragments: the reply's fragment, or the whole model
        of a join's or the final reply; an acknowledged final push holds none); with --sync-moments its second moments
        into this group's AdamW once the model holds R replica outer gradients (async_moments.loads_moments; not
        before this group's AdamW has stepped: a restarted group's join sets none)."""
        fragment = int(reply.get("fragment", 0))
        if final and not reply["final"]:  # a fragment's final push acknowledged: the final model comes later
            return
        if reply["final"] or fragment < 0 or not self.fragmented:
            part, values = range(self.numel), self.layout.standard(reply["model"])
        else:
            part = self.layout.ranges[fragment]
            values = reply["model"]
        with torch.no_grad():  # the parameters at flat positions part.start..part.stop
            offset = 0
            for local in map(local_shard, self.params):  # a sharded slot's: this process's shards (in place)
                lo, hi = max(part.start, offset), min(part.stop, offset + local.numel())
                if lo < hi:
                    local.view(-1)[lo - offset:hi - offset].copy_(values[lo - part.start:hi - part.start].to(local.dtype))
                offset += local.numel()
        if self.moments_after is not None and self.optimizer.state and \
                loads_moments(int(reply["updates"]), self.config.replicas):
            moments = flat_moments(self.optimizer, self.params)
            moments[part.start:part.stop] = values[len(part):]
            load_moments(self.optimizer, self.params, moments)
            self.moments_loaded += 1

    # --- training -----------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Train to the run's end; a group restarted so late that the run ended before it got the final model
        writes no results (`missed_end`)."""
        try:
            self._train()
        except RunEnded:
            self.missed_end = self.held.model is None or self.held.updates < self.budget

    def _train(self) -> None:
        cfg, started = self.config, time.monotonic()
        if self.incarnation == 0:
            self._barrier()
        self._adopt(self.link.exchange(None, False))  # join: the current global model
        self.positions.publish(self.held.version)
        updates = self.positions.least(self.held.updates)  # every position holds a copy now
        self.link.votes_copy = True
        self.store.compare_set("t0", "", repr(time.time()))
        if self.incarnation > 0 and self.rank == 0:
            self._note_rejoin(time.monotonic() - started)
        step = progress_steps(updates, self.sync_every, cfg.replicas)  # a restarted group: the run's place
        fragments = len(self.layout.ranges)
        since, last_pushed, inner, last = [0] * fragments, fragments - 1, 0, time.perf_counter()
        while updates < self.budget:
            lr_step = min(cfg.run.steps - 1, progress_steps(updates, self.sync_every, cfg.replicas))
            record = self._train_step(step, lr_step)
            inner += 1
            since = [n + 1 for n in since]
            # the whole model each H steps; fragment p at streaming's offset p x H // P of its period (module doc)
            due = [p for p in range(fragments) if fragment_due(inner - 1, p, fragments, self.sync_every)]
            if due:
                gradient = self._outer_gradient(due[0])
                exchanged = time.perf_counter()
                self._adopt(self.link.exchange(gradient, False, fragment=due[0]))
                self.positions.publish(self.held.version)
                updates = self.positions.least(self.held.updates)
                # the exchange's wall seconds (elections included) and the outer gradient's bytes this group sent
                record.update(comm_s=time.perf_counter() - exchanged, dp_bytes=gradient.numel() * 4)
                if self.size > 1:  # the group's record digests its positions' parameters (summary.merge_stage_records)
                    record.update(params_sha256=params_digest(self.params))
                since[due[0]], last_pushed = 0, due[0]
            record.update(wall_s=time.perf_counter() - last, global_updates=self.held.updates,
                          synced=bool(due), **self._carried())
            last = time.perf_counter()
            self.records.append(record)
            self.observer.step(record)
            self._note_checkpoints()
            step += 1
            if self.rank == 0:
                self.store.set(f"step/{self.group}", str(step))
        for k in range(fragments):  # every fragment's final push, cyclically on from the last pushed
            p = (last_pushed + 1 + k) % fragments
            self._adopt(self.link.exchange(self._outer_gradient(p) if since[p] else None, True, fragment=p), True)
        if self.records:  # the final exchange's messages count in the last step's record
            last_record = self.records[-1]
            last_record.update({k: (last_record[k] or 0.0) + v for k, v in self._carried().items()})
            if self.moments_after is not None:  # the final model's v and this group's AdamW's (equal: loaded)
                last_record.update(moments_loaded=self.moments_loaded,
                                   moments_sha256=params_digest([flat_moments(self.optimizer, self.params)]),
                                   held_moments_sha256=params_digest(
                                       [self.layout.standard(self.held.model)[self.numel:]]))  # type: ignore
        # the run's end for its summary (train_s, the final model's samples): the first group to hold the final model
        self.store.compare_set(FINAL_KEY, "", json.dumps({"t": time.time(), "updates": self.held.updates}))
        self.link.close()
        hosted = self.end_hosting()
        self._note_checkpoints()
        # the end's, once: by the last host of the global model (a --stop-after's was written at its update)
        if hosted and self.config.checkpoint.checkpoint_dir is not None and self.stop == cfg.run.steps:
            self.observer.event("checkpoint", cfg.run.steps, **save_group_checkpoint(
                cfg, self.group, self.rank, cfg.run.steps, self.model.module, self, self.model.boundaries,
                self.checkpoints.protect))

    def _note_checkpoints(self) -> None:
        """A checkpoint event for each checkpoint this group's server wrote since the last call."""
        for step, event in self.checkpoints.take_events():
            self.observer.event("checkpoint", step, **event)

    def end_hosting(self) -> bool:
        """Every final reply is out: end the server this group hosts (if any); whether it hosted the global model."""
        return self.link.end_hosting()

    def settle(self, timer: Any) -> None:
        """Nothing in flight at the end (save_group_checkpoint settles its sync first)."""

    def state_dict(self) -> dict[str, Any]:
        """The end checkpoint's sync state: the inner AdamW and the final global model this group holds (a
        finished asynchronous run: not resumed from, as a non-elastic one's end)."""
        held = self.held
        return {"optimizer": self.optimizer.state_dict(), "finished": True,
                "asynchronous": {"elastic": True, "anchor": held.model, "version": held.version,
                                 "outer_step": held.updates,
                                 "pushes": self.link.acked, "inner_steps": len(self.records)}}

    def _train_step(self, step: int, lr_step: int) -> dict[str, Any]:
        cfg = self.config
        self.timer.seconds = 0.0
        self.slowdown.before_step()
        x, y = self.data.batch(cfg.data.data_seed, step, self.group, cfg.replicas, cfg.schedule.batch_size,
                               self.seq_len)
        rows = shard_rows(int(x.shape[0]), self.position.k, self.position.shard)  # K > 1: this shard's part
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(lr_step, cfg.run.steps, cfg.optim.lr)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model.train_step(x[rows], y[rows])
        with self.timer:
            self.optimizer.step()
        self.slowdown.after_compute(self.timer.seconds)
        return {"step": step, "loss": loss, "batch_sum": int(x.sum()), "samples": int(x.shape[0]),
                "contributors": None, "params_sha256": None, "emulated_s": None, "compute_s": self.timer.seconds,
                "comm_s": 0.0, "dp_bytes": 0, "sent_bytes": None, "inter_region_bytes": None, "link_s": None,
                "cut_wait_s": None}

    def _carried(self) -> dict[str, float]:
        """The bytes and emulated seconds of this process's messages since the last record (links.SocketPacing: a
        request and its reply both count at the client; a region server's requests upstream and their replies at its
        host; none without emulated links) and the wall seconds they waited for a partition's heal (links.CutHold;
        none without a partition in --chaos)."""
        carried = {} if self.pacing is None else self.pacing.take()
        return carried if self.cuts is None else {**carried, **self.cuts.take()}

    def _barrier(self) -> None:
        """Every group has started once (a fresh run's server must not run ahead of groups still importing)."""
        self.store.set(f"ready/{self.group}/0", "1")
        self.store.wait([f"ready/{g}/0" for g in range(self.config.replicas)], timedelta(seconds=self.timeout_s))

    def _note_rejoin(self, seconds: float) -> None:
        number = self.store.add("rejoins", 1)
        step = progress_steps(self.held.updates, self.sync_every, self.config.replicas)
        self.observer.event("rejoin", step, seconds=seconds)
        self.store.set(f"rejoin/{number}", json.dumps({"group": self.group, "step": step,
                                                       "t": time.time(), "seconds": seconds}))

    def finish(self, result_dir: Path) -> None:
        """Write this group's final parameters and records (read by the launcher; none if it missed the end)."""
        cfg = self.config
        if self.missed_end:
            self.observer.close()
            return
        torch.save(_flat(self.params), params_path(result_dir, self.group, self.rank))
        val = self.model.validation_loss(self.data.val, self.seq_len, cfg.data.eval_windows, cfg.schedule.batch_size)
        steps = self.records[-1]["step"] + 1 if self.records else 0
        summary = {"group": self.group, "stage": self.position.stage, "rank": self.rank, "steps": steps,
                   "val_loss": val, "records": self.records, "failed_quorums": 0}
        path = summary_path(result_dir, self.group, self.rank)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(summary))
        tmp.replace(path)
        self.observer.close()
