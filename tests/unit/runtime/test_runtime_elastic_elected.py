"""Elections of an asynchronous tier's host (runtime/elastic/elected.py) on a real TCPStore, and the regions of an
elastic hierarchical run's groups (runtime/elastic/async_regions.py)."""

from __future__ import annotations

import json
import json
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from geotrain.runtime.elastic.async_regions import group_regions
from geotrain.runtime.elastic.elected import ElectedLink, ElectionError, HeldModel, Tier, elect, group_vote
from geotrain.cluster.io import parse_cluster_text
from geotrain.runtime.config import RuntimeConfig
from runtime_2x2 import CLUSTER_YAML

COPY = HeldModel(torch.zeros(2), version=7, updates=9)
NONE = HeldModel(None)


def _tier(seedless: bool = False, grace_s: float = 0.1, timeout_s: float = 10.0) -> Tier:
    return Tier("async/region1/", (2, 3), 2, 1, grace_s, timeout_s, b"key", seedless)


@pytest.fixture
def store():
    master = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield master


def test_a_voter_without_a_copy_waits_for_one_with_a_copy_that_sees_the_loss_later(store):
    won = []
    other = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))  # its own client
    waiting = threading.Thread(target=lambda: won.append(elect(other, _tier(), 1, 3, NONE)))
    waiting.start()
    waiting.join(0.5)  # past its 0.1 s window: it has not decided (it holds no copy)
    assert waiting.is_alive() and not store.check(["async/region1/host/1"])
    assert elect(store, _tier(), 1, 2, COPY) == 2
    waiting.join(10)
    assert won == [2]


def test_a_seedless_tier_elects_its_lowest_voter_when_no_voter_holds_a_copy(store):
    assert elect(store, _tier(seedless=True), 1, 3, NONE) == 3  # the only voter: the window passes, it serves
    assert elect(store, _tier(seedless=True), 1, 2, NONE) == 3  # decided once: a later voter reads the answer


def test_a_tier_that_needs_a_copy_ends_in_one_line_when_none_voted(store):
    with pytest.raises(ElectionError) as caught:
        elect(store, _tier(timeout_s=0.2), 1, 3, NONE)
    assert "none holding a copy" in str(caught.value) and "\n" not in str(caught.value)


def test_a_following_tiers_host_is_its_leaders_elected_group_whatever_its_own_copy_holds(store):
    """Position (0, 0) of groups of several processes elects the host group; every other position's tier follows it
    (one group hosts every position, each from its own copy), counting no election of its own."""
    leader = Tier("async/", (0, 1, 2), 0, 1, 0.1, 10.0, b"key")
    follower = Tier("async/position1/", (0, 1, 2), 0, 1, 0.1, 10.0, b"key", follows="async/")
    decided = []
    waiting = threading.Thread(target=lambda: decided.append(elect(
        dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10)), follower, 1, 2,
        HeldModel(torch.zeros(2), version=99, updates=99))))  # fresher at its position: still not its own vote
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and not store.check(["async/position1/vote/1/2", "async/position1/host/1"])
    assert elect(store, leader, 1, 1, COPY) == 1
    waiting.join(10)
    assert decided == [1]
    with pytest.raises(ElectionError) as caught:  # no leader decided within grace + timeout: one line
        elect(store, Tier("async/position1/", (0, 1), 0, 1, 0.1, 0.1, b"key", follows="async/"), 2, 0, COPY)
    assert "no host of async was elected" in str(caught.value) and "\n" not in str(caught.value)


def test_a_group_of_several_positions_votes_with_its_stalest_positions_copy_version():
    """Its host serves every position from that position's own copy: the freshest stalest copy loses the least."""
    assert group_vote(COPY, [9, 5]).version == 5 and group_vote(COPY, [8]).version == 7
    assert group_vote(COPY, [5]).updates == 9 and group_vote(COPY, []) is COPY and group_vote(NONE, [1]) is NONE
    assert group_vote(COPY, None).model is None  # a position of the group holds no copy: it votes none
    fresher, staler = group_vote(COPY, [6]), group_vote(HeldModel(torch.zeros(2), version=9, updates=9), [4])
    assert fresher.version > staler.version  # group of versions (7, 6) wins over (9, 4)


def test_groups_are_numbered_by_the_region_of_their_device_in_group_order():
    config = RuntimeConfig.of(parse_cluster_text(CLUSTER_YAML), [[2, 0, 3, 1]])  # devices 0, 1 east; 2, 3 west
    assert group_regions(config) == (0, 1, 0, 1)


class Served(Exception):
    """The link's serve callback was called (the test stops there)."""


def test_a_restarted_first_host_without_a_copy_does_not_serve_epoch_0_again_but_is_elected_for_epoch_1(store):
    with socket.socket() as probe:  # a port nothing listens on: epoch 0's dead host
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()
    store.set("async/region1/address/0", json.dumps(list(dead)))
    store.set("async/region1/epoch", "0")
    served = []

    def serve(epoch: int):
        served.append(epoch)
        raise Served

    link = ElectedLink(store, _tier(seedless=True), 2, NONE, serve, fresh=False)  # group 2: epoch 0's host
    with pytest.raises(Served):
        link.exchange(None, False)
    assert served == [1]


def test_the_global_models_host_is_looked_up_through_each_tiers_last_published_epoch(store):
    """kill-site site=host (the launcher's lookup, async_regions.global_model_host): epoch 0's host until an election
    is published; with regions, the group hosting the server of the region that hosts the global model."""
    from geotrain.runtime.elastic.async_regions import global_model_host

    cluster = parse_cluster_text(CLUSTER_YAML)
    flat = RuntimeConfig.of(cluster, [[2, 0, 3, 1]], elastic=True, time_scale=0.0, sync_every=3, outer_sync="async")
    regions = RuntimeConfig.of(cluster, [[2, 0, 3, 1]], elastic=True, time_scale=0.0, sync_every=3,
                               outer_sync="async-hierarchical")  # groups 0, 2: region 0; 1, 3: region 1
    assert global_model_host(store, flat) == 0 and global_model_host(store, regions) == 0
    store.set("async/host/1", "1")
    assert global_model_host(store, flat) == 0  # elected, not yet published: the old host still serves
    store.set("async/epoch", "1")
    assert global_model_host(store, flat) == 1
    assert global_model_host(store, regions) == 1  # region 1's epoch-0 host: its first group
    store.set("async/region1/host/1", "3")
    store.set("async/region1/epoch", "1")
    assert global_model_host(store, regions) == 3


def test_an_elected_server_holds_the_bound_with_the_live_clients_bases_and_lets_a_dead_ones_go(store):
    """The lost server's replies carry every client's base and process; an elected server (epoch 1, the bound 2)
    restores those of the live clients (not the lost host's, 0, nor client 3's: restarted), holds the fast client 1
    at the bound for the slow client 2, and lets it through once the launcher marks client 2 down for good."""
    from geotrain.optim.delayed_nesterov import DelayedNesterov
    from geotrain.runtime.elastic.elected import live_bases, publish_host, watch_restored
    from geotrain.sync.async_server import OuterServer
    from geotrain.sync.async_socket import SocketClient, SocketServer

    def serving(server: OuterServer) -> SocketServer:
        return SocketServer(server, "127.0.0.1", b"key")

    tier = Tier("async/", (0, 1, 2, 3), 0, 1, 0.1, 10.0, b"key")
    old = serving(OuterServer(torch.zeros(2), DelayedNesterov(1, 1.0, 0.0, 0.0), [], 2))
    publish_host(store, tier, 0, old)
    links = {c: ElectedLink(store, tier, c, HeldModel(torch.zeros(2)), lambda epoch: old, True, (c, 0))
             for c in range(4)}
    for link in links.values():
        link.exchange(None, False)                            # all join at version 0
    links[1].exchange(torch.ones(2), False)
    links[1].exchange(torch.ones(2), False)                   # version 2: clients 0, 2, 3 still at base 0
    held = links[1].held
    assert held.version == 2 and held.bases == {0: (0, (0, 0)), 1: (2, (1, 0)), 2: (0, (2, 0)), 3: (0, (3, 0))}
    old.close()
    store.set("incarnation/3", "1")                           # the launcher restarted client 3
    restored = live_bases(store, tier, 1, held)
    assert restored == {1: (2, (1, 0)), 2: (0, (2, 0))}
    new = OuterServer(held.model, DelayedNesterov(1, 1.0, 0.0, 0.0), [], 2)
    new.start_from(held.version, held.updates, held.applied, {c: base for c, (base, _) in restored.items()})
    host = serving(new)
    watch_restored(store, host, restored)
    fast = SocketClient(host.address, b"key", 30.0)
    got = {}
    worker = threading.Thread(target=lambda: got.update(fast.exchange(
        {"client": 1, "base": 2, "gradient": torch.ones(2), "count": 1, "final": False, "acked": 2, "join": True,
         "process": (1, 0)})))
    worker.start()
    deadline = time.monotonic() + 30
    while not new.waiting:                                    # held: version 2 - client 2's base 0 = the bound
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert new.version == 2 and not got
    store.set("down/2", "1")                                  # client 2 is down for good: not waited for
    worker.join(30)
    assert got["version"] == 3 and got["bases"] == {1: [3, (1, 0)]}
    fast.close()
    host.close()


def test_an_elected_server_started_from_a_copy_with_second_moments_serves_them_and_merges_the_next_push(store):
    """--sync-moments (runtime/elastic/async_group.py): a copy is [parameters | AdamW's v] as every reply carries it,
    so a server elected from it (epoch 1) replies the copy's global v to a join, and moves v toward a push's by the
    push's weight / N (sync/async_moments.py MomentMerge: 2 clients, fresh: half way)."""
    from geotrain.runtime.elastic.elected import serve_restored
    from geotrain.sync.async_moments import push_of, server_optimizer
    from geotrain.sync.async_server import OuterServer
    from geotrain.sync.async_socket import SocketClient, SocketServer

    held = HeldModel(torch.tensor([1.0, 2.0, 0.04, 0.02]), version=5, updates=9)
    server = OuterServer(held.model, server_optimizer("staleness", 2, 1.0, 0.0, 1.0, 2), [], 2)
    tier = Tier("async/", (0, 1), 0, 1, 0.1, 10.0, b"key")
    host = serve_restored(store, tier, 1, held, server, lambda: SocketServer(server, "127.0.0.1", b"key"))
    client = SocketClient(host.address, b"key", 30.0)
    request = {"client": 1, "base": 5, "gradient": None, "count": 1, "final": False, "acked": 0, "join": True,
               "process": (1, 0)}
    joined = client.exchange(request)
    assert joined["version"] == 5 and joined["updates"] == 9 and torch.equal(joined["model"], held.model)
    pushed = client.exchange({**request, "gradient": push_of(joined["model"], torch.tensor([1.0, 2.0, 0.08, 0.0]), 2),
                              "join": False})
    assert pushed["version"] == 6
    torch.testing.assert_close(pushed["model"], torch.tensor([1.0, 2.0, 0.06, 0.01]), rtol=0, atol=1e-7)
    client.close()
    host.close()
