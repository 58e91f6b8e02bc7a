"""Asynchronous DiLoCo with P fragments: a position's global model as P fragment servers behind one serving thread.

The fragments are streaming DiLoCo's (geotrain.sync.streaming.fragment_pieces: contiguous runs of the parameters, so
fragment p is a contiguous range of the flat model). A replica pushes fragment p's outer gradient (its anchor's
fragment less its parameters' fragment) after the steps streaming syncs fragment p at (fragment_due: offset
p x H // P in the period of H), blocks for the reply, and adopts the fragment's global values, as its parameters and
its anchor for that fragment only. Bytes per push are about 1 / P of the model's.

The server (`FragmentServer`): one OuterServer (geotrain.sync.async_server) per fragment, over that fragment of the
global model, with its own outer optimizer (delayed Nesterov is elementwise: P fragment optimizers are the whole
model's, split), version, clients' bases, staleness bound and budget. So staleness is per fragment: a push of
fragment p is `version_p - base_p` stale, with `base_p` the fragment-p version its client last received (its anchor
for p), and its staleness weight is the fragment's; a version counts the updates applied to that fragment.
`updates` of fragment 0 (synced at the period's end) is the count of whole replica periods the model holds: the
`outer_step` replicas see and stop at (the run's budget B). A fragment p > 0 is pushed once more per replica than
fragment 0 (its first push after p x H // P steps, its last a final push with the period's tail), so its server's
cap is B + R for R replicas: at equal speeds every push of every fragment is applied, and the final model holds the
same inner steps as with one fragment.

Why it cannot deadlock: the P servers are served by one thread from one mailbox, so there is one serving order
across them (on emulated links one emulated-time order, and with several positions the first position's order, as
whole-model async has), and every client pushes its fragments in cyclic order. A held push of fragment q waits
for a client Y whose fragment-q base is the oldest and who has not sent fragment q; if Y is itself held, at its
next fragment q', Y's fragment-q' base came before its fragment-q base (it pushes q' next, cyclically), so Y's oldest
reply is strictly earlier in the serving order than its waiter's: a chain of held clients goes strictly back in one
order and ends at a client that computes or whose push can be applied. With P = 1 this is OuterServer's rule.

Ending: a finishing client sends a final push of every fragment, cyclically from the one after its last push. The
fragment server takes each (a final gives up the client's place in that fragment's bound, OuterServer) and answers
every one but the client's last at once with an acknowledgement (a header, no values): a client held
on a final reply while its bases still held other fragments' bounds could deadlock the others. The reply to the
last comes when every client has finished every fragment: the whole final global model, the same on every client.

Checkpoint rounds (async_server's pauses) are fragment 0's: its server opens them by its count, its replies name
them, and a client pauses right after a fragment-0 reply (the period's start, as with one fragment). A pause holds
the client's place in every fragment (it pushes nothing meanwhile, so no fragment's bound waits for it); when every
running client is paused, fragment 0 lets them go and every other fragment's round closes with it. With the
clients' anchors (versions and steps since each fragment's push) and each fragment server's state a checkpoint
holds the whole exchange: nothing is in flight in a round.

Moment sync (`--sync-moments`, geotrain.sync.async_moments): the client lays the global model out fragment by
fragment, each fragment's parameters then their second moments ([params_0 | v_0 | params_1 | v_1 ...]), so a
fragment's part is MomentMerge's layout over that fragment and its pushes and replies carry its v beside it.

Regions (async-hierarchical, geotrain.sync.async_region): a region's server is a relay FragmentServer for its
replicas, and it merges each fragment upstream on its own, every `merge_every` updates of that fragment, to a global
FragmentServer whose clients are the regions; a region merges its fragments in turn (cyclically, blocking on each
merge as it does without fragments), so at the global server it is a client that pushes cyclically and the argument
above holds there too; its final merges go in turn as a replica's final pushes do. A fragment p > 0's cap at the
global server is B + R, R the replicas (not the regions).

Elastic groups (`--elastic --outer-sync async --fragments P`, runtime/elastic/async_group.py): clients come and go.
`join(client, bases)` takes a client's base in each fragment (None: a fragment whose final push it has sent, so its
place there is dropped), `leave(client)` drops it from every fragment, and both settle the end as `submit` does (a
client gone is not waited for). `current` is the whole model (fragment -1: a joining client's). An elected host starts
from its copy with `start_from`: each fragment's version, count, per-client applied counts and the live clients' bases,
as of the copy's last reply of that fragment. `model_state` is the checkpoint's: every fragment's version, count and
outer optimizer, the whole model flat.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.sync.async_server import OuterServer, Reply, Request
from geotrain.sync.base import SyncError
from geotrain.sync.streaming import fragment_pieces, tensor_rows


def fragment_ranges(params: Sequence[torch.Tensor], fragments: int, split: str = "layers") -> list[range]:
    """The flat index range of each of `fragments` fragments of the flat model of `params` (in order), cut as
    streaming DiLoCo cuts them (streaming.fragment_pieces, `split` of FRAGMENT_SPLITS: contiguous runs of rows)."""
    starts = list(itertools.accumulate((p.numel() for p in params), initial=0))

    def flat(piece: Any, row: int) -> int:  # the flat index of `row` of the piece's tensor
        return starts[piece.index] + row * params[piece.index].numel() // tensor_rows(params[piece.index])
    return [range(flat(pieces[0], pieces[0].start), flat(pieces[-1], pieces[-1].stop))
            for pieces in fragment_pieces(params, fragments, split)]


@dataclass(frozen=True, eq=False)
class FragmentLayout:
    """A position's global model cut in fragments, as its clients lay it out: `ranges` each fragment's flat range of
    the parameters, `wire` its range of the global model (with moments: its parameters, then their v), `order` the
    global model's indices into [parameters | v] where the two differ (fragments and moments, module doc), else None."""

    ranges: tuple[range, ...]
    wire: tuple[range, ...]
    order: torch.Tensor | None = None

    @classmethod
    def of(cls, params: Sequence[torch.Tensor], fragments: int, split: str, parts: int) -> FragmentLayout:
        """The layout of `params` in `fragments` (cut by `split`) with `parts` values per parameter (2: its v too)."""
        numel = sum(p.numel() for p in params)
        ranges = [range(numel)] if fragments == 1 else fragment_ranges(params, fragments, split)
        order = None
        if fragments > 1 and parts > 1:
            order = torch.cat([torch.arange(r.start, r.stop) + k * numel for r in ranges for k in range(parts)])
        return cls(tuple(ranges), tuple(range(parts * r.start, parts * r.stop) for r in ranges), order)

    def laid_out(self, flat: torch.Tensor) -> torch.Tensor:
        """`flat` ([parameters | v]) in the global model's layout."""
        return flat if self.order is None else flat[self.order]

    def standard(self, model: torch.Tensor) -> torch.Tensor:
        """`model` (the global model's layout) as [parameters | v]: `laid_out`'s inverse."""
        if self.order is None:
            return model
        standard = torch.empty_like(model)
        standard[self.order] = model
        return standard


class FragmentServer:
    """A position's global model in fragments (module doc): `ranges` each fragment's flat range of `model`,
    `optimizers` one outer optimizer per fragment; `clients`, `staleness_bound`, `budget`, `pauses`, `relay` as
    OuterServer's (the pauses: fragment 0's, module doc; `relay`: a region's, its rounds let go by async_region);
    `replicas` the replicas whose pushes reach it (through region servers: more than its clients; None: its clients)."""

    def __init__(self, model: torch.Tensor, ranges: Sequence[range], optimizers: Sequence[Any], clients: list[int],
                 staleness_bound: int, budget: int | None = None, pauses: Sequence[tuple[int, int]] = (),
                 relay: bool = False, replicas: int | None = None) -> None:
        if len(ranges) != len(optimizers) or not ranges:
            raise SyncError(f"asynchronous DiLoCo: {len(ranges)} fragments and {len(optimizers)} outer optimizers")
        self.ranges = list(ranges)
        if ranges[0].start != 0 or any(a.stop != b.start for a, b in zip(ranges, ranges[1:])):
            raise SyncError(f"asynchronous DiLoCo: fragments must be contiguous ranges from 0 in order, got {ranges}")
        # the other fragments relay their rounds: fragment 0 lets the paused clients go (module doc)
        # a fragment p > 0 is pushed once more per client than fragment 0 (module doc): its cap is one more each
        extra = len(clients) if replicas is None else replicas
        caps = [budget if budget is None or p == 0 else budget + extra for p in range(len(ranges))]
        self.fragments = [OuterServer(model[r.start:r.stop], optimizer, clients, staleness_bound, caps[p],
                                      pauses if p == 0 else (), relay=relay or p > 0)
                          for p, (r, optimizer) in enumerate(zip(self.ranges, optimizers))]
        self.clients = list(clients)
        self.relay = relay
        self.awaiting: dict[int, int] = {}
        """Client -> the fragment of its request the server holds (one each: a client blocks on its reply)."""
        self.finals_left = {client: len(self.ranges) for client in clients}
        """Final pushes each client has still to send (module doc: Ending)."""
        self.ended = False
        """Every client got the final model."""

    @property
    def model(self) -> torch.Tensor:
        """The whole global model (the fragments' values in order)."""
        return torch.cat([server.model for server in self.fragments])

    @property
    def updates(self) -> int:
        """Replica periods in the model: fragment 0's count (module doc)."""
        return self.fragments[0].updates

    @property
    def version(self) -> int:
        """Fragment 0's version (an election's vote)."""
        return self.fragments[0].version

    @property
    def versions(self) -> list[int]:
        """Each fragment's version."""
        return [server.version for server in self.fragments]

    @property
    def counts(self) -> list[int]:
        """Each fragment's count of replica outer gradients."""
        return [server.updates for server in self.fragments]

    @property
    def base(self) -> dict[int, list[int | None]]:
        """Each running client's base in every fragment (None: not running there: its final push is in)."""
        clients = sorted(set().union(*(server.base for server in self.fragments)))
        return {c: [server.base.get(c) for server in self.fragments] for c in clients}

    @property
    def applied(self) -> dict[int, list[int]]:
        """Each client's outer gradients applied, per fragment."""
        clients = sorted(set().union(*(server.applied for server in self.fragments)))
        return {c: [server.applied.get(c, 0) for server in self.fragments] for c in clients}

    @property
    def max_staleness(self) -> int:
        return max(server.max_staleness for server in self.fragments)

    @property
    def discarded(self) -> int:
        return sum(server.discarded for server in self.fragments)

    def senders(self) -> list[int]:
        """The clients that can still send a request: not finished, none of their requests held."""
        return [c for c in self.clients if c not in self.awaiting and self.finals_left[c] > 0]

    def finished(self) -> bool:
        """Every client has its final model: the serving thread stops."""
        return self.ended

    def plan_pauses(self, pauses: Sequence[tuple[int, int]]) -> None:
        """Set the checkpoint rounds (OuterServer.plan_pauses): fragment 0's (module doc)."""
        self.fragments[0].plan_pauses(pauses)

    @property
    def round(self) -> int:
        """The open checkpoint round's step (fragment 0's, OuterServer.round); 0: none."""
        return self.fragments[0].round

    def all_paused(self) -> bool:
        """Every running client waits at a checkpoint round (OuterServer.all_paused)."""
        return self.fragments[0].all_paused()

    def closing_round(self) -> int:
        """The step a round closing now is named by (OuterServer.closing_round, fragment 0's)."""
        return self.fragments[0].closing_round()

    def join_round(self, step: int) -> None:
        """Open the round of `step` (OuterServer.join_round): fragment 0's."""
        self.fragments[0].join_round(step)

    def release(self, step: int) -> list[Reply]:
        """Let every paused client go (OuterServer.release), in every fragment: fragment 0's go replies."""
        go = [dataclasses.replace(reply, fragment=0) for reply in self.fragments[0].release(step)]
        for server in self.fragments[1:]:
            server.release(step)
        return self._settled(go)

    def close_through(self, step: int) -> None:
        """The rounds through `step` are closed (OuterServer.close_through), in every fragment."""
        for server in self.fragments:
            server.close_through(step)

    def _pause(self, request: Request) -> list[Reply]:
        """A client's pause (after a fragment-0 reply): its place held in every fragment, fragment 0 last; if that
        lets every paused client go, the other fragments' rounds close with it."""
        replies = []
        for p in reversed(range(len(self.fragments))):
            server = self.fragments[p]
            step = dataclasses.replace(request, base=server.base[request.client], fragment=p)
            replies += [dataclasses.replace(reply, fragment=p) for reply in server.submit(step)]
        if not self.fragments[0].paused:  # fragment 0 let them go: the others' rounds close with it
            for server in self.fragments[1:]:
                server.release(self.fragments[0].closed)
        return replies

    def submit(self, request: Request) -> list[Reply]:
        """Take one request of fragment `request.fragment`; the replies due now (module doc)."""
        p = request.fragment
        if not 0 <= p < len(self.fragments):
            raise SyncError(f"asynchronous DiLoCo: request for fragment {p} of {len(self.fragments)}")
        if request.pause and p != 0:
            raise SyncError(f"asynchronous DiLoCo: a pause names fragment {p} (pauses follow fragment 0's replies)")
        if request.client in self.awaiting or self.finals_left.get(request.client, 0) == 0:
            raise SyncError(f"asynchronous DiLoCo: client {request.client} sent a request with one held or after "
                            f"its last final one")
        self.finals_left[request.client] -= request.final
        self.awaiting[request.client] = p
        if request.pause:
            replies = self._pause(request)
        else:  # each fragment's final replies are not sent: the whole model goes once every fragment has ended
            replies = [dataclasses.replace(reply, fragment=p)
                       for reply in self.fragments[p].submit(request) if not reply.final]
        return self._settled(self._ending(replies))

    def join(self, client: int, bases: Sequence[int | None]) -> list[Reply]:
        """A client that (re)connects (elastic runs, module doc) with its base in each fragment (None: its final push of
        that fragment is in); any earlier place of it is forgotten; the replies that lets through."""
        if len(bases) != len(self.fragments):
            raise SyncError(f"asynchronous DiLoCo: client {client} joined with {len(bases)} fragment bases, the "
                            f"model has {len(self.fragments)} fragments")
        self.awaiting.pop(client, None)
        if client not in self.clients:
            self.clients.append(client)
        self.finals_left[client] = sum(base is not None for base in bases)
        replies = []
        for p, (server, base) in enumerate(zip(self.fragments, bases)):
            moved = server.leave(client) if base is None else server.join(client, base)
            replies += [dataclasses.replace(reply, fragment=p) for reply in moved if not reply.final]
        return self._settled(self._ending(replies))

    def leave(self, client: int) -> list[Reply]:
        """A client that is gone (elastic runs): dropped from every fragment; the replies its absence lets through."""
        self.awaiting.pop(client, None)
        self.finals_left.pop(client, None)
        self.clients = [c for c in self.clients if c != client]
        replies = []
        for p, server in enumerate(self.fragments):
            replies += [dataclasses.replace(reply, fragment=p) for reply in server.leave(client) if not reply.final]
        return self._settled(self._ending(replies))

    def current(self, client: int, fragment: int = -1) -> Reply:
        """The whole model now (fragment -1), for a joining client that sends nothing; or `fragment`'s, for one whose
        push of it the server holds already (its other fragments' progress is its own)."""
        if fragment < 0:
            return Reply(client, self.version, self.updates, self.model, False, fragment=-1)
        return dataclasses.replace(self.fragments[fragment].current(client), fragment=fragment)

    def start_from(self, versions: Sequence[int], counts: Sequence[int], applied: dict[int, Sequence[int]],
                   bases: dict[int, Sequence[int | None]]) -> None:
        """Take up a copy of the global model (an elected host's, module doc): each fragment's version and count,
        each client's applied counts per fragment and the bases of the live clients (None: not in that fragment)."""
        for p, server in enumerate(self.fragments):
            server.start_from(int(versions[p]), int(counts[p]), {c: int(n[p]) for c, n in applied.items()},
                              {c: int(b[p]) for c, b in bases.items() if b[p] is not None})
        self.clients = sorted(bases)
        self.finals_left = {c: sum(b is not None for b in bases[c]) for c in self.clients}

    def model_state(self) -> dict[str, Any]:
        """The global model's state (OuterServer.model_state, an elastic checkpoint's): the whole model flat, fragment
        0's version and count, and every fragment's version, count and outer optimizer."""
        return {"model": self.model, "version": self.version, "updates": self.updates, "versions": self.versions,
                "counts": self.counts, "max_staleness": self.max_staleness, "discarded": self.discarded,
                "optimizer": {"fragments": [server.optimizer.state_dict() for server in self.fragments]}}

    def _ending(self, replies: list[Reply]) -> list[Reply]:
        """`replies`, and the acknowledgements of final pushes applied that are not their client's last, and once
        every fragment has ended the whole final model for every client (module doc: Ending)."""
        for client, q in self.awaiting.items():  # a final push applied, not the client's last: acknowledged
            server = self.fragments[q]
            if (self.finals_left[client] > 0 and client not in server.base
                    and all(r.client != client for r in server.waiting)):
                replies.append(dataclasses.replace(server.current(client), fragment=q, model=torch.empty(0)))
        if not self.ended and all(not server.base and not server.waiting for server in self.fragments):
            self.ended = True
            model = self.model
            replies += [Reply(client, self.fragments[0].version, self.updates, model.clone(), True)
                        for client in self.clients]
        return replies

    def _settled(self, replies: list[Reply]) -> list[Reply]:
        """`replies`, their clients no longer held."""
        for reply in replies:
            self.awaiting.pop(reply.client, None)
        return replies

    def state_dict(self) -> dict[str, Any]:
        """Every fragment server's state (OuterServer.state_dict), in fragment order."""
        return {"fragments": [server.state_dict() for server in self.fragments]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["fragments"]) != len(self.fragments):
            raise ValueError(f"checkpoint's global model has {len(state['fragments'])} fragments, this run's "
                             f"{len(self.fragments)}")
        for server, part in zip(self.fragments, state["fragments"]):
            server.load_state_dict(part)
