"""A region's server in hierarchical asynchronous DiLoCo (`--outer-sync async-hierarchical`, after HALoS, 2025):
the region's model, its replicas' updates merged over the fast links, and its exchanges with the global server.

The region server is an OuterServer (geotrain.sync.async_server) for the region's replicas. Every `merge_every`
region updates (and at the end) it sends the global server its delta (the region model - the global model it last
got) with the count of replica outer gradients in it, and adopts the global model it gets back; the replicas
answered then go on from that model.

Checkpoint rounds reach the replicas through it: its round opens when its own count of replica updates (the global
count at its last merge plus the region's since) reaches a pause of the run, or when the global server's reply to a
merge names an open round. Once every replica of the region is paused, the region pauses at the global server (a
pause request naming its round, no delta: the region's unmerged updates stay in its model) and lets its replicas go
when the global server lets every region go, with the step that go names. Its state (region model, version, count,
outer momentum, replicas' bases, the global model it merged from) is saved with the region's first rank's shard.
A region's count is never behind the global count it last got, and the run's pauses lie below its budget, so a
region passes every round before any of its replicas can reach the budget and stop.
"""

from __future__ import annotations

from typing import Any

from geotrain.sync.async_fragments import FragmentServer
from geotrain.sync.async_moments import MomentMerge, push_of
from geotrain.sync.async_server import OuterServer, Reply, Request
from geotrain.sync.async_timing import LinkTimer
from geotrain.sync.async_wire import Mailbox


class RegionServer:
    """A region's server (module doc): `server` (a relay OuterServer, or a relay FragmentServer: a region of P
    fragments, geotrain.sync.async_fragments) for its replicas, `upstream` the global server's mailbox, `leader` its
    rank. On emulated links its upstream requests leave at `timer`'s clock, through its uplink. With fragments each
    fragment merges on its own, every `merge_every` of its updates, and the region merges its fragments in turn
    (fragment p's merge waits for fragment p - 1's): at the global server the region is a client that pushes its
    fragments cyclically, as a replica does (async_fragments: why that cannot deadlock)."""

    def __init__(self, server: OuterServer | FragmentServer, upstream: Mailbox, leader: int, merge_every: int,
                 timer: LinkTimer | None = None) -> None:
        if not server.relay:
            raise ValueError("a region's server must relay its checkpoint rounds (relay=True)")
        self.server = server
        self.parts: list[OuterServer] = server.fragments if isinstance(server, FragmentServer) else [server]
        self.upstream = upstream
        self.leader = leader
        self.merge_every = merge_every
        self.timer = timer
        self.anchors = [part.model.clone() for part in self.parts]
        self.moments_from = [part.optimizer.numel if isinstance(part.optimizer, MomentMerge) else None
                             for part in self.parts]
        """Where each part's second moments start (async_moments: its push carries them as they are); None: none."""
        self.versions_got = [0] * len(self.parts)
        self.updates_got = [0] * len(self.parts)
        self.merged_at = [0] * len(self.parts)
        self.next = 0
        """The fragment this region merges next (in turn)."""

    @property
    def global_updates(self) -> int:
        """The global count of replica updates this region last got (fragment 0's: periods)."""
        return self.updates_got[0]

    def handle(self, request: Request) -> list[Reply]:
        return self.settle(self.server.submit(request))

    def settle(self, replies: list[Reply]) -> list[Reply]:
        """The replies due after the region's server gave `replies` (to a request, or to a client's leave)."""
        finals = [r for r in replies if r.final]
        if finals:
            for _ in range(len(self.parts)):  # every fragment's final merge, in turn; the last brings the end
                final = self._merge(self.next, final=True)
            ended = [Reply(r.client, final.version, final.updates, final.model, True) for r in finals]
            return [r for r in replies if not r.final] + ended
        p = self.next
        if replies and self.parts[p].version - self.merged_at[p] >= self.merge_every:
            merged = self._merge(p, final=False)  # the replicas answered now go on from the merged model
            # (a final push's acknowledgement stays one: async_fragments)
            replies = [r if r.fragment != p or not r.model.numel() else
                       Reply(r.client, r.version, merged.updates, merged.model.clone(), False,
                             checkpoint=self.server.round, fragment=p) for r in replies]
        if self.server.all_paused():  # the region waits at a checkpoint round: it pauses at the global server
            went = self._upstream(Request(self.leader, self.versions_got[0], None, 0, pause=True,
                                          round=self.server.closing_round()))
            replies += self.server.release(went.checkpoint)
        return replies

    def _upstream(self, request: Request) -> Reply:
        """Send `request` to the global server and block for its reply."""
        if self.timer is None:
            return self.upstream.request(self.leader, request)[0]
        # the region's replies then leave when the global model is back
        reply, arrival = self.upstream.request(self.leader, request, self.timer.now_s, self.timer)
        self.timer.now_s = max(self.timer.now_s, arrival)
        return reply

    def _merge(self, p: int, final: bool) -> Reply:
        """Merge fragment `p` (the whole region model without fragments) upstream; the next in turn is p + 1."""
        part, anchor, moments = self.parts[p], self.anchors[p], self.moments_from[p]
        count = part.updates - self.updates_got[p]
        delta = None if count == 0 else (anchor - part.model if moments is None else push_of(anchor, part.model,
                                                                                              moments))
        reply = self._upstream(Request(self.leader, self.versions_got[p], delta, count, final, fragment=p))
        self.next = (p + 1) % len(self.parts)
        if final and len(self.parts) > 1:  # an acknowledgement, or the end's whole model (async_fragments)
            return reply
        part.model.copy_(reply.model)
        self.anchors[p] = reply.model.clone()
        self.versions_got[p] = reply.version
        self.updates_got[p] = part.updates = reply.updates
        self.merged_at[p] = part.version
        if not final and p == 0:  # a round the global server holds open, or one the region's new count reached
            self.server.join_round(reply.checkpoint)
        return reply

    def state_dict(self) -> dict[str, Any]:
        """The region's model and server state and the global model it last merged from (in a checkpoint round); per
        fragment with fragments."""
        one = len(self.parts) == 1

        def each(values: list[Any]) -> Any:
            return values[0] if one else list(values)
        return {"server": self.server.state_dict(), "anchor": each([a.clone() for a in self.anchors]),
                "global_version": each(self.versions_got), "global_updates": each(self.updates_got),
                "merged_version": each(self.merged_at), "next": self.next}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def each(value: Any) -> list[Any]:
            return list(value) if isinstance(value, list) else [value]
        anchors = each(state["anchor"])
        if [a.shape for a in anchors] != [a.shape for a in self.anchors]:
            raise ValueError(f"checkpoint's region model has {sum(a.numel() for a in anchors)} values in "
                             f"{len(anchors)} fragments, this one {sum(a.numel() for a in self.anchors)} in "
                             f"{len(self.anchors)}")
        self.server.load_state_dict(state["server"])
        self.anchors = [a.clone() for a in anchors]
        self.versions_got = [int(v) for v in each(state["global_version"])]
        self.updates_got = [int(v) for v in each(state["global_updates"])]
        self.merged_at = [int(v) for v in each(state["merged_version"])]
        self.next = int(state.get("next", 0))
