"""One replica group of an elastic hierarchical asynchronous run (`train --elastic --outer-sync
async-hierarchical`): a client of its region's server, and while elected that server's host (and maybe
the global model's).

Two tiers of elected servers (runtime/elastic/elected.py), over TCP as in the flat elastic run
(runtime/elastic/async_group.py):
- a region server per cluster region (geotrain.sync.async_region.RegionServer, unchanged: the region's model, its
  groups' outer gradients merged over the fast links, its delta sent to the global server every merge_every = the
  region's group count region updates). Its clients are the region's groups; it is hosted by one of them, epoch 0
  by the region's first group, and re-elected inside the region (keys `async/region<r>/`) from the freshest copy a
  group of the region holds (the last region model it received) when its host dies;
- the global model's server, whose clients are the region servers (client id: the region). Epoch 0's host is
  region 0's server host; when it dies the region servers elect the host of the region holding the freshest copy
  of the global model (the last one its region server got back). It averages the regions' deltas (lr 1, no
  momentum), as the non-elastic hierarchical run.

A region server's host that dies closes its connection to the global server: its region leaves the global
server's staleness bound until its new host joins. An elected server of either tier restores the bases of its
copy's live clients (the other regions', or the region's other groups'), so the bound holds as at the server it
replaces (runtime/elastic/elected.py serve_restored). A region server elected from a copy starts from that region
model and merges from it (its anchor): the region's updates its lost host had not yet merged are lost (counted in
`lost_updates`; at most merge_every region updates), its groups resend the request the lost server did not
answer. A killed group that hosted nothing is a client that left its region (the region goes on); a region
whose every group is gone has no server, so the global server stops waiting for it (its connection closed).

Moments (--sync-moments): every tier's server holds [parameters | v] and merges v (sync/async_moments.py
MomentMerge; a region server's merge upstream carries its v: async_region), so a copy at either tier holds the v its
server last replied.

Fragments (--fragments P): every tier's server is a FragmentServer (geotrain.sync.async_fragments). A region's is a
relaying one in a RegionServer, as without --elastic: each fragment merges upstream on its own, every merge_every of
its updates, the region merging its fragments in turn, through its link to the global model's server, whose clients
are the regions (each pushing its fragments cyclically: the deadlock argument of async_fragments holds there). Its
groups push fragments as in the flat run (async_group.py); a region server elected from a copy starts each fragment
from that fragment's part of it (fragment_copy.py) and merges it from there, based at the global version of that
fragment its link's join got.

Positions (a group of S x K > 1 processes: async_group.py, Positions): both tiers are split by position (s, k).
Position (s, k) of each group is the client of its region's server for that position (keys under
`async/position<rank>/region<r>/`; position (0, 0)'s under `async/region<r>/`), and that server's host pushes to the
same position's global server (keys under async_positions.position_prefix). At each tier position (0, 0) votes for
the group (its stalest position's copy: elected.group_vote; at the global tier none while a position of it holds no
copy of the global model yet, each position publishing its copy's version after each reply) and the other positions
follow its decision (elected.Tier.follows), so one group hosts a region's servers, and one region's host group the
global model's, at every position. Checkpoints: each position's global server writes its shard (async_checkpoint.py).

Ending: as the flat run, one tier up: a region server sends its final delta once all its groups sent their final
requests, and the global server replies to the regions' finals once every connected region sent its own; each
host then marks its tier ended and waits for its clients to close (the global model's host writes the end's
checkpoint).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.async_group import AsyncElasticGroup
from geotrain.runtime.elastic.async_positions import GroupPositions
from geotrain.runtime.elastic.elected import ElectedLink, HeldModel, Tier, serve_counting, serve_restored, tier_host
from geotrain.runtime.elastic.links import GroupNet
from geotrain.sync.async_fragments import FragmentServer
from geotrain.sync.async_moments import server_optimizer
from geotrain.sync.async_region import RegionServer
from geotrain.sync.async_server import OuterServer, Reply, Request
from geotrain.sync.async_socket import SocketServer
from geotrain.sync.async_wire import own_store_client
from geotrain.cost.async_outer import STALENESS_BOUND


def group_regions(config: RuntimeConfig) -> tuple[int, ...]:
    """Each replica group's region: its stage-0 device's cluster region, numbered in the order of the groups (the
    region of group 0 is 0)."""
    found = [int(config.cluster.region_of[int(device)]) for device in config.assignment[0]]
    order = list(dict.fromkeys(found))
    return tuple(order.index(region) for region in found)


def global_model_host(store: Any, config: RuntimeConfig) -> int:
    """The replica group hosting the global model's server now (`--chaos kill-site:...,site=host`): the flat run's
    elected host; with regions, the host of the region server that hosts it."""
    if config.optim.outer_sync != "async-hierarchical":
        return tier_host(store, "async/", 0)
    regions = group_regions(config)
    region = tier_host(store, "async/", 0)
    return tier_host(store, f"async/region{region}/", regions.index(region))


class ServedRegion:
    """A RegionServer behind the interface of the OuterServer (or, with fragments, the FragmentServer) that a
    SocketServer serves (its request's, join's and leave's replies go through the region's merges)."""

    def __init__(self, region: RegionServer) -> None:
        self.region = region

    @property
    def fragmented(self) -> bool:
        """The region's server is a FragmentServer (--fragments P > 1): requests and replies name fragments."""
        return isinstance(self.region.server, FragmentServer)

    @property
    def versions(self) -> list[int]:
        return self.region.server.versions  # type: ignore[union-attr]

    @property
    def counts(self) -> list[int]:
        return self.region.server.counts  # type: ignore[union-attr]

    @property
    def applied(self) -> dict[int, int]:
        return self.region.server.applied

    @property
    def base(self) -> dict[int, int]:
        return self.region.server.base

    @property
    def version(self) -> int:
        return self.region.server.version

    @property
    def updates(self) -> int:
        return self.region.server.updates

    def submit(self, request: Request) -> list[Reply]:
        return self.region.handle(request)

    def join(self, client: int, base: Any) -> list[Reply]:
        return self.region.settle(self.region.server.join(client, base))

    def leave(self, client: int) -> list[Reply]:
        return self.region.settle(self.region.server.leave(client))

    def current(self, client: int, fragment: int = -1) -> Reply:
        server = self.region.server
        return server.current(client, fragment) if self.fragmented else server.current(client)  # type: ignore[call-arg]


class Upstream:
    """A region server's requests to the global model's server, through its elected link (the mailbox interface
    RegionServer sends through); `positions`: where its copy's version is published after each reply, for its group's
    vote (GroupPositions of tier `global/`)."""

    def __init__(self, link: ElectedLink, positions: GroupPositions) -> None:
        self.link, self.positions = link, positions

    def request(self, client: int, request: Request) -> list[Reply]:
        reply = self.link.exchange(request.gradient, request.final, request.count, request.fragment)
        self.positions.publish(self.link.held.version)
        return [Reply(client, int(reply["version"]), int(reply["updates"]), reply["model"], bool(reply["final"]),
                      fragment=int(reply.get("fragment", 0)))]


class RegionalAsyncGroup(AsyncElasticGroup):
    """Replica group `group` of an elastic hierarchical asynchronous run (module doc; arguments as
    AsyncElasticGroup's)."""

    def __init__(self, config: RuntimeConfig, group: int, store: Any, net: GroupNet, incarnation: int,
                 authkey: bytes, world: Any = None, rank: int = 0) -> None:
        self.regions = group_regions(config)
        self.region = self.regions[group]
        self.upstream: ElectedLink | None = None
        """The region server's link to the global model's server (while this group hosts its region's)."""
        super().__init__(config, group, store, net, incarnation, authkey, world, rank)

    def client_tier(self) -> Tier:
        """This position's tier of its region's server: any one live group of the region elects it, even with no
        copy (it starts from the global model)."""
        members = tuple(g for g, r in enumerate(self.regions) if r == self.region)
        return replace(self.position_tier(f"region{self.region}/", members, members[0]), min_votes=1, seedless=True)

    def _serve(self, epoch: int) -> SocketServer:
        """Host this region's server from this group's copy for `epoch` (module doc): join the global model's
        server first."""
        held, outer, members = self.held, self.options.outer, len(self.link.tier.electorate)
        fresh = self.incarnation == 0 and epoch == 0  # the run's first region servers: the seed's global model
        regions = tuple(sorted(set(self.regions)))
        tier = replace(self.position_tier("", regions, 0), min_votes=1)  # the quorum of regions: any one
        # its requests leave from the region server's threads: a store client of their own
        # (a resumed run's: the checkpoint's global model, version and count)
        copy = HeldModel(held.model.clone(), held.version, held.updates, versions=list(held.versions),
                         counts=list(held.counts)) if fresh and held.model is not None else HeldModel(None)
        store = own_store_client(self.store)
        self.upstream = self.elected_link(store, tier, self.region, copy, self._serve_global, fresh)
        # each position publishes its copy's version (after each reply: Upstream); the group votes its stalest
        # position's, none while a position holds none (elected.group_vote)
        positions = GroupPositions(store, self.group, self.incarnation, self.rank, self.size, "global/")
        if self.rank == 0 and self.size > 1:
            self.upstream.group_versions = positions.complete_versions
        if copy.model is not None:
            positions.publish(copy.version)
        joined = self.upstream.exchange(None, False)  # the global model's version now: the base of the next merge
        positions.publish(self.upstream.held.version)
        if held.model is None:  # no group of the region held a copy: the region starts from the global model
            counts = [int(n) for n in joined["counts"]] if self.fragmented else []  # (with fragments: each one's)
            held = HeldModel(joined["model"], 0, int(joined["updates"]), versions=[0] * len(counts), counts=counts)
        heterogeneity = self.options.heterogeneity

        def optimizer(numel: int | None) -> Any:
            return server_optimizer(heterogeneity.async_merge, members, outer.outer_lr, outer.outer_momentum,
                                    heterogeneity.async_staleness_power, numel)
        server: OuterServer | FragmentServer
        if self.fragmented:  # a region of P fragments, each merged upstream on its own (sync/async_region.py)
            server = FragmentServer(held.model, self.layout.wire,
                                    [optimizer(None if self.moments_after is None else len(r))
                                     for r in self.layout.ranges], [], STALENESS_BOUND, None, relay=True,
                                    replicas=self.config.replicas)
        else:
            server = OuterServer(held.model, optimizer(self.moments_after), [], STALENESS_BOUND, None, relay=True)
        upstream = Upstream(self.upstream, positions)
        region = RegionServer(server, upstream, self.region, members)  # type: ignore[arg-type]
        # each fragment merges from the copy's values of it (its anchor), based at the global version of it now
        got = [int(v) for v in joined["versions"]] if self.fragmented else [int(joined["version"])]
        region.versions_got, region.updates_got = got, list(held.counts or [held.updates])
        region.merged_at = list(held.versions or [held.version])
        return serve_restored(self.store, self.link.tier, epoch, held, server, lambda: serve_counting(
            self.store, self.link.tier.prefix, epoch, ServedRegion(region), 0, self.net.advertise, self.authkey,
            lambda updates: updates - region.global_updates))

    def _serve_global(self, epoch: int) -> SocketServer:
        """Host the global model from this region server's copy: the mean of the regions' deltas."""
        assert self.upstream is not None
        return self.serve_global(self.upstream.tier, epoch, self.upstream.held, len(set(self.regions)), 1.0, 0.0)

    def end_hosting(self) -> bool:
        """End the region's server if this group hosts it (its groups closed), then its link to the global model's
        server, and that server if hosted here; whether the global model's was."""
        self.link.end_hosting()
        if self.upstream is None:
            return False
        self.upstream.close()
        return self.upstream.end_hosting()
