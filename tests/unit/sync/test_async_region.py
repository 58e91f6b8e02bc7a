"""Hierarchical asynchronous DiLoCo's region servers (geotrain.sync.async_region) in one process, in a fixed arrival
order: a checkpoint round reaches every replica through its region, and a run restored from the state written in
the round (the global server's, each region's, each replica's model and version) ends on the uninterrupted run's
models to the bit. The wire is the global server called directly (a blocked pause waits in its region's thread)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from geotrain.optim.delayed_nesterov import DelayedNesterov
from geotrain.sync.async_region import RegionServer
from geotrain.sync.async_server import OuterServer, Reply, Request

REGIONS = {0: [0, 1], 2: [2, 3]}
"""Region leader -> its replicas (the leader's rank is the region's id at the global server)."""
ORDER = [0, 2, 1, 3, 1, 0, 3, 2]
"""The replicas' arrival order, repeated (each arrival: one outer gradient, or a pause when told)."""
WAIT_S = 10.0


class DirectUpstream:
    """The global server's mailbox for region servers in this process: a request is served at once (under a lock);
    a request whose reply is not due (a region's pause) blocks its region's thread until a later request brings
    it."""

    def __init__(self, top: OuterServer) -> None:
        self.top = top
        self.lock = threading.Lock()
        self.replies: dict[int, Reply] = {}
        self.ready = {leader: threading.Event() for leader in REGIONS}

    def request(self, client: int, request: Request, *_: object) -> tuple[Reply, float]:
        with self.lock:
            for reply in self.top.submit(request):
                self.replies[reply.client] = reply
                self.ready[reply.client].set()
        assert self.ready[client].wait(WAIT_S), f"region {client}: no reply"
        self.ready[client].clear()
        return self.replies.pop(client), 0.0


@dataclass
class Replica:
    """A replica as AsyncOuterSync keeps it: the model it holds, the region version it came from, the round it
    last paused for, and whether it is told to pause at its next arrival."""

    model: torch.Tensor
    version: int = 0
    checkpointed: int = 0
    pause: int = 0
    waiting: bool = False


def _servers(model: torch.Tensor, pauses: list[tuple[int, int]]) -> tuple[OuterServer, dict[int, RegionServer]]:
    top = OuterServer(model, DelayedNesterov(2, 1.0, 0.0, 0.0), list(REGIONS), 8)
    upstream = DirectUpstream(top)
    regions = {}
    for leader, members in REGIONS.items():
        server = OuterServer(model, DelayedNesterov(2, 0.7, 0.9, 0.5), members, 8, relay=True)
        server.plan_pauses(pauses)
        regions[leader] = RegionServer(server, upstream, leader, 2)  # type: ignore[arg-type]
    return top, regions


def _gradient(client: int, model: torch.Tensor) -> torch.Tensor:
    """A replica's outer gradient from `model`: depends on the model, so the order of updates shows in the end."""
    return 0.3 * (model - torch.linspace(-1.0, 1.0, model.numel()) * (client + 1)) + 0.01 * model.square()


def _run(regions: dict[int, RegionServer], replicas: dict[int, Replica], start: int, arrivals: int,
         stop_round: int | None = None) -> int:
    """Arrivals `start`.. in ORDER's order up to `arrivals`, and on until no replica waits at a round (a waiting
    replica's arrival is skipped; once all wait, the round closes); with `stop_round`, stop once every replica has
    paused for it (the checkpoint's moment). The next arrival's index."""
    leader = {client: lead for lead, members in REGIONS.items() for client in members}
    threads = {lead: ThreadPoolExecutor(1) for lead in REGIONS}
    futures: list[Future] = []

    def deliver(done: list[Reply]) -> None:
        for reply in done:
            replica = replicas[reply.client]
            if replica.waiting:  # the go: model and version unchanged, the round it closed at
                replica.waiting, replica.checkpointed, replica.pause = False, reply.checkpoint, 0
                continue
            replica.model, replica.version = reply.model.clone(), reply.version
            replica.pause = reply.checkpoint if reply.checkpoint > replica.checkpointed else 0

    index = start
    try:
        while index < arrivals or any(r.waiting for r in replicas.values()):
            if all(r.waiting for r in replicas.values()):  # the round closes: every go comes back
                for future in futures:
                    deliver(future.result(timeout=WAIT_S))
                futures.clear()
                continue
            if stop_round is not None and all(r.checkpointed >= stop_round for r in replicas.values()):
                break
            client = ORDER[index % len(ORDER)]
            replica = replicas[client]
            index += 1
            if replica.waiting:  # its round cannot close before every replica has paused
                continue
            if replica.pause:
                replica.waiting = True
                request = Request(client, replica.version, None, 0, pause=True, round=replica.pause)
            else:
                request = Request(client, replica.version, _gradient(client, replica.model))
            future = threads[leader[client]].submit(regions[leader[client]].handle, request)
            if request.pause:  # its region's last pause blocks until the other region pauses too
                futures.append(future)
            else:
                deliver(future.result(timeout=WAIT_S))
    finally:
        for pool in threads.values():
            pool.shutdown(wait=False)
    return index


def _models(top: OuterServer, regions: dict[int, RegionServer], replicas: dict[int, Replica]) -> list[torch.Tensor]:
    return [top.model, *(r.server.model for r in regions.values()), *(r.model for r in replicas.values())]


def test_a_run_restored_from_a_hierarchical_checkpoint_round_ends_on_the_uninterrupted_runs_models():
    model, pauses, arrivals = torch.linspace(0.5, -0.5, 6), [(5, 3), (11, 6)], 40
    top, regions = _servers(model, pauses)
    replicas = {c: Replica(model.clone()) for members in REGIONS.values() for c in members}
    assert _run(regions, replicas, 0, arrivals) == arrivals
    assert {r.checkpointed for r in replicas.values()} == {6}  # both rounds reached all 4 replicas
    uninterrupted = [m.clone() for m in _models(top, regions, replicas)]

    top, regions = _servers(model, pauses)
    replicas = {c: Replica(model.clone()) for members in REGIONS.values() for c in members}
    stopped = _run(regions, replicas, 0, arrivals, stop_round=3)
    assert {r.checkpointed for r in replicas.values()} == {3} and stopped < arrivals
    saved = {"top": top.state_dict(), **{f"region{lead}": r.state_dict() for lead, r in regions.items()}}
    assert sum(r.server.updates - r.global_updates for r in regions.values()) + top.updates >= 5
    places = {c: (r.model.clone(), r.version, r.checkpointed) for c, r in replicas.items()}

    top, regions = _servers(torch.zeros(6), [])  # restored: nothing but the checkpoint carries over
    top.load_state_dict(saved["top"])
    for lead, region in regions.items():
        region.load_state_dict(saved[f"region{lead}"])
        region.server.plan_pauses([(11, 6)])  # the resumed run's rounds after step 3
    replicas = {c: Replica(m, version, checkpointed) for c, (m, version, checkpointed) in places.items()}
    assert _run(regions, replicas, stopped, arrivals) == arrivals
    for restored, reference in zip(_models(top, regions, replicas), uninterrupted, strict=True):
        assert torch.equal(restored, reference)


class OneRegionUpstream:
    """The global server called directly by the one region there is (its replies are due at once)."""

    def __init__(self, top: object) -> None:
        self.top = top

    def request(self, client: int, request: Request, *_: object) -> tuple[Reply, float]:
        (reply,) = self.top.submit(request)  # type: ignore[attr-defined]
        return reply, 0.0


def test_a_region_of_fragments_merges_each_fragment_upstream_in_turn():
    """async-hierarchical with 2 fragments (sync/async_fragments.py): a fragment's region updates reach the global
    server as that fragment's delta, fragment 0 then 1 then 0 (a fragment whose turn has not come waits)."""
    from geotrain.sync.async_fragments import FragmentServer

    ranges = [range(0, 2), range(2, 4)]

    def server(clients: list[int], relay: bool) -> FragmentServer:  # theta -= g (lr 1, no momentum, full weight)
        return FragmentServer(torch.zeros(4), ranges, [DelayedNesterov(1, 1.0, 0.0, 0.0) for _ in ranges], clients,
                              8, relay=relay, replicas=2)
    top = server([0], relay=False)
    region = RegionServer(server([10, 11], relay=True), OneRegionUpstream(top), 0, 1)  # type: ignore[arg-type]
    (reply,) = region.handle(Request(10, 0, torch.full((2,), 1.0), fragment=0))   # region 0: -1, merged: top -1
    assert (reply.fragment, reply.updates) == (0, 1) and reply.model.tolist() == [-1.0, -1.0]
    (reply,) = region.handle(Request(11, 0, torch.full((2,), 2.0), fragment=0))   # region 0: -3; fragment 1's turn
    assert reply.model.tolist() == [-3.0, -3.0] and top.model.tolist() == [-1.0, -1.0, 0.0, 0.0]
    region.handle(Request(10, 0, torch.full((2,), 4.0), fragment=1))               # fragment 1 merges: top -4
    assert top.model.tolist() == [-1.0, -1.0, -4.0, -4.0] and region.next == 0
    (reply,) = region.handle(Request(11, 0, torch.full((2,), 8.0), fragment=1))   # region 1: -12; fragment 0's turn
    assert top.model.tolist() == [-3.0, -3.0, -4.0, -4.0]                           # fragment 0's delta: -1 - -3 = 2
    assert reply.model.tolist() == [-12.0, -12.0] and region.next == 1
    assert [part.updates for part in top.fragments] == [2, 1]                      # replica updates per fragment
