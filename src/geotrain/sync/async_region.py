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

from geotrain.sync.async_moments import MomentMerge, push_of
from geotrain.sync.async_server import OuterServer, Reply, Request
from geotrain.sync.async_timing import LinkTimer
from geotrain.sync.async_wire import Mailbox


class RegionServer:
    """A region's server (module doc): `server` (a relay OuterServer) for its replicas, `upstream` the global
    server's mailbox, `leader` its rank. On emulated links its upstream requests leave at `timer`'s clock, through
    its uplink."""

    def __init__(self, server: OuterServer, upstream: Mailbox, leader: int, merge_every: int,
                 timer: LinkTimer | None = None) -> None:
        if not server.relay:
            raise ValueError("a region's OuterServer must relay its checkpoint rounds (OuterServer(relay=True))")
        self.server = server
        self.upstream = upstream
        self.leader = leader
        self.merge_every = merge_every
        self.timer = timer
        self.anchor = server.model.clone()
        self.moments_from = server.optimizer.numel if isinstance(server.optimizer, MomentMerge) else None
        """Where the model's second moments start (async_moments: its push carries them as they are); None: none."""
        self.global_version = 0
        self.global_updates = 0
        self.merged_version = 0

    def handle(self, request: Request) -> list[Reply]:
        return self.settle(self.server.submit(request))

    def settle(self, replies: list[Reply]) -> list[Reply]:
        """The replies due after the region's server gave `replies` (to a request, or to a client's leave)."""
        finals = [r for r in replies if r.final]
        if finals:
            final = self._merge(final=True)
            ended = [Reply(r.client, final.version, final.updates, final.model, True) for r in finals]
            return [r for r in replies if not r.final] + ended
        if replies and self.server.version - self.merged_version >= self.merge_every:
            merged = self._merge(final=False)  # the replicas answered now go on from the merged model
            replies = [Reply(r.client, r.version, merged.updates, merged.model.clone(), False,
                             checkpoint=self.server.round) for r in replies]
        if self.server.all_paused():  # the region waits at a checkpoint round: it pauses at the global server
            went = self._upstream(Request(self.leader, self.global_version, None, 0, pause=True,
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

    def _merge(self, final: bool) -> Reply:
        count = self.server.updates - self.global_updates
        delta = None if count == 0 else (self.anchor - self.server.model if self.moments_from is None
                                         else push_of(self.anchor, self.server.model, self.moments_from))
        reply = self._upstream(Request(self.leader, self.global_version, delta, count, final))
        self.server.model.copy_(reply.model)
        self.anchor = reply.model.clone()
        self.global_version = reply.version
        self.global_updates = self.server.updates = reply.updates
        self.merged_version = self.server.version
        if not final:  # a round the global server holds open, or one the region's new count reached
            self.server.join_round(reply.checkpoint)
        return reply

    def state_dict(self) -> dict[str, Any]:
        """The region's model and server state and the global model it last merged from (in a checkpoint round)."""
        return {"server": self.server.state_dict(), "anchor": self.anchor.clone(),
                "global_version": self.global_version, "global_updates": self.global_updates,
                "merged_version": self.merged_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["anchor"].shape != self.anchor.shape:
            raise ValueError(f"checkpoint's region model has {state['anchor'].numel()} values, this one "
                             f"{self.anchor.numel()}")
        self.server.load_state_dict(state["server"])
        self.anchor = state["anchor"].clone()
        self.global_version, self.global_updates = int(state["global_version"]), int(state["global_updates"])
        self.merged_version = int(state["merged_version"])
