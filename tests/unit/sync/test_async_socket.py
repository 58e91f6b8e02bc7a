"""The TCP transport of elastic asynchronous DiLoCo (geotrain.sync.async_socket): a client whose connection closes
stops being waited for, a rejoining gradient the copy already holds is not applied twice, a silent server is not a
lost one, and a server that is gone is HostLost."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from geotrain.optim.delayed_nesterov import DelayedNesterov
from geotrain.sync.async_server import OuterServer
from geotrain.sync.async_socket import HostLost, ServerSilent, SocketClient, SocketServer

KEY = b"run"


@pytest.fixture
def serving():
    """SocketServer(bound) factory (lr 1, no momentum: theta -= g); each closed at the end, its threads ended."""
    hosts: list[SocketServer] = []

    def start(bound: int) -> SocketServer:
        hosts.append(SocketServer(OuterServer(torch.zeros(2), DelayedNesterov(1, 1.0, 0.0, 0.0), [], bound),
                                  "127.0.0.1", KEY))
        return hosts[-1]

    yield start
    for host in hosts:
        host.close()
    _until(lambda: not [t for t in threading.enumerate() if t.name.startswith("geotrain-async")])


def _message(client: int, gradient: float | None, *, base: int = 0, acked: int = 0, join: bool = False) -> dict:
    return {"client": client, "base": base, "gradient": None if gradient is None else torch.full((2,), gradient),
            "final": False, "acked": acked, "join": join}


def _until(condition) -> None:
    """Wait for `condition` (bounded: 30 s, a failure)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_client_whose_connection_closes_no_longer_holds_the_others(serving):
    host = serving(0)  # bound 0: every update waits for every running client
    first, second = (SocketClient(host.address, KEY, 30.0) for _ in range(2))
    assert first.exchange(_message(0, None, join=True))["version"] == 0
    assert second.exchange(_message(1, None, join=True))["version"] == 0
    got = {}
    worker = threading.Thread(target=lambda: got.update(first.exchange(_message(0, 1.0))))
    worker.start()
    _until(lambda: host.server.waiting)  # held for client 1
    second.close()                       # its process died: the kernel closes its connection
    worker.join(30)
    assert got["version"] == 1 and got["updates"] == 1 and host.server.base == {0: 1}
    torch.testing.assert_close(got["model"], torch.full((2,), -1.0))
    first.close()


def test_a_rejoining_gradient_the_elected_copy_holds_is_not_applied_again(serving):
    host = serving(8)
    host.server.start_from(4, 4, {0: 3})  # the copy already holds client 0's third gradient
    client = SocketClient(host.address, KEY, 30.0)
    reply = client.exchange(_message(0, 1.0, base=3, acked=2, join=True))  # its third: the reply never came
    assert (reply["version"], reply["updates"], reply["applied"]) == (4, 4, {0: 3})
    reply = client.exchange(_message(0, 1.0, base=4, acked=3))  # its fourth is new
    assert (reply["version"], reply["updates"]) == (5, 5)
    client.close()


def test_a_silent_server_is_not_a_lost_one_and_a_closed_one_is(serving):
    host = serving(0)
    first, second = (SocketClient(host.address, KEY, 0.5) for _ in range(2))
    first.exchange(_message(0, None, join=True))
    second.exchange(_message(1, None, join=True))
    with pytest.raises(ServerSilent):  # held by client 1, which is alive: no election
        first.exchange(_message(0, 1.0))
    first.close()
    second.close()
    host.wait_closed(30)
    with pytest.raises(HostLost):  # nothing listens any more
        SocketClient(host.address, KEY, 0.5)


def test_a_fragment_servers_rejoining_push_is_checked_against_its_fragments_applied_count_and_copies_follow():
    """With fragments (async_fragments.FragmentServer behind the socket) the join's bases and acked counts are per
    fragment: the elected copy holds client 0's fragment-1 push (applied 1 > acked 0), not its fragment-0 push; a
    client's copy (runtime/elastic/fragment_copy.py) takes each reply's fragment only."""
    from geotrain.runtime.elastic.elected import HeldModel
    from geotrain.runtime.elastic.fragment_copy import adopted, fragment_request
    from geotrain.sync.async_fragments import FragmentServer

    wires = (range(0, 2), range(2, 4))
    server = FragmentServer(torch.zeros(4), wires, [DelayedNesterov(1, 1.0, 0.0, 0.0) for _ in wires], [], 8)
    server.start_from([2, 1], [2, 1], {0: [1, 1]}, {})
    host = SocketServer(server, "127.0.0.1", KEY)
    try:
        client = SocketClient(host.address, KEY, 30.0)
        held = HeldModel(torch.zeros(4), 1, 1, versions=[1, 0], counts=[1, 0])
        message = {"client": 0, **fragment_request(held, 2, set(), [0, 0]), "fragment": 1, "final": False,
                   "gradient": torch.ones(2), "join": True}
        reply = client.exchange(message)  # the copy holds it: not applied again, the fragment as it is
        assert (reply["fragment"], reply["version"], reply["versions"]) == (1, 1, [2, 1])
        held = adopted(held, reply, wires)
        assert held.versions == [1, 1] and held.version == 1 and held.applied == {0: [0, 1]}
        assert server.base == {0: [1, 1]}  # fragment 0 still from the version the client holds
        reply = client.exchange({**message, **fragment_request(held, 2, set(), [0, 1]), "fragment": 0,
                                 "gradient": torch.ones(2), "join": False})  # fragment 0's push is new
        held = adopted(held, reply, wires)
        assert held.versions == [3, 1] and held.counts == [3, 1] and held.bases == {0: ([3, 1], None)}
        assert reply["updates"] == 3 and server.max_staleness == 1  # pushed from version 1 of fragment 0, at 2
        torch.testing.assert_close(held.model, torch.tensor([-1.0, -1.0, 0.0, 0.0]))
        client.close()
    finally:
        host.close()
