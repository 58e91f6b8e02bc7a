"""Asynchronous DiLoCo with fragments (geotrain.sync.async_fragments): a push updates its fragment only, with the
fragment's own staleness weight; streaming's fragments as flat ranges; the end; no deadlock under the bound."""

from __future__ import annotations

import random

import pytest
import torch

from geotrain.optim.delayed_nesterov import DelayedNesterov
from geotrain.sync.async_fragments import FragmentLayout, FragmentServer, fragment_ranges
from geotrain.sync.async_server import Request
from geotrain.sync.base import SyncError


def _server(clients: int, bound: int, power: float = 0.0, sizes: tuple[int, ...] = (2, 2)) -> FragmentServer:
    starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    ranges = [range(a, b) for a, b in zip(starts, starts[1:])]
    # lr 1, no momentum, period 1: theta -= weight x g, weight (1 + staleness) ** -power
    return FragmentServer(torch.zeros(sum(sizes)), ranges, [DelayedNesterov(1, 1.0, 0.0, power) for _ in sizes],
                          list(range(clients)), bound)


def test_a_push_updates_its_fragment_only_with_the_fragments_staleness_weight():
    server = _server(2, 8, power=1.0)
    (reply,) = server.submit(Request(0, 0, torch.tensor([1.0, 3.0]), fragment=0))
    assert (reply.client, reply.fragment, reply.version, reply.updates) == (0, 0, 1, 1)
    torch.testing.assert_close(reply.model, torch.tensor([-1.0, -3.0]))           # fragment 0's values only
    (reply,) = server.submit(Request(1, 0, torch.tensor([2.0, 2.0]), fragment=0))  # 1 update stale: weight 1/2
    torch.testing.assert_close(reply.model, torch.tensor([-1.0 - 1.0, -3.0 - 1.0]))
    (reply,) = server.submit(Request(1, 0, torch.tensor([4.0, 8.0]), fragment=1))  # fragment 1 is at version 0
    assert (reply.fragment, reply.version) == (1, 1)
    torch.testing.assert_close(reply.model, torch.tensor([-4.0, -8.0]))          # fresh: weight 1
    torch.testing.assert_close(server.model, torch.tensor([-2.0, -4.0, -4.0, -8.0]))
    assert server.updates == 2 and server.max_staleness == 1                      # fragment 0's count: periods


def test_fragments_are_streamings_as_flat_ranges():
    params = [torch.zeros(2, 3), torch.zeros(4), torch.zeros(2, 4)]  # 24, 16, 32 bytes
    assert fragment_ranges(params, 2, "layers") == [range(0, 10), range(10, 18)]  # cut between tensors 1 and 2
    assert fragment_ranges(params, 2, "bytes") == [range(0, 9), range(9, 18)]     # 36 bytes: 3 rows into tensor 1
    assert fragment_ranges(params, 1) == [range(0, 18)]


def test_finals_are_acknowledged_and_every_client_gets_the_whole_final_model():
    server = _server(2, 1)
    (ack,) = server.submit(Request(0, 0, torch.tensor([1.0, 1.0]), final=True, fragment=1))
    assert not ack.final and ack.fragment == 1 and ack.model.numel() == 0          # not its last: answered at once
    assert server.submit(Request(0, 0, None, final=True, fragment=0)) == []        # its last: held for the end
    assert server.senders() == [1]
    assert len(server.submit(Request(1, 0, torch.tensor([2.0, 2.0]), final=True, fragment=0))) == 1
    replies = server.submit(Request(1, 0, None, final=True, fragment=1))
    assert sorted(r.client for r in replies) == [0, 1] and all(r.final for r in replies)
    torch.testing.assert_close(replies[0].model, torch.tensor([-2.0, -2.0, -1.0, -1.0]))
    assert torch.equal(replies[0].model, replies[1].model) and server.finished()
    with pytest.raises(SyncError, match="after its last final"):
        server.submit(Request(1, 0, None, fragment=0))


@pytest.mark.parametrize("seed", range(20))
def test_cyclic_pushes_never_deadlock_and_keep_each_fragments_bound(seed):
    """Clients of random speeds push their fragments cyclically (module doc): some client can always go on."""
    rng = random.Random(seed)
    clients, fragments, bound, pushes = 3, 3, 1, 12
    server = _server(clients, bound, sizes=(1,) * fragments)
    base = {(c, p): 0 for c in range(clients) for p in range(fragments)}
    sent = {c: 0 for c in range(clients)}
    blocked: set[int] = set()
    while not server.finished():
        free = [c for c in range(clients) if c not in blocked and server.finals_left[c] > 0]
        assert free, f"deadlock: every client held, seed {seed}"
        c = rng.choice(free)
        p, final = sent[c] % fragments, sent[c] >= pushes
        blocked.add(c)
        sent[c] += 1
        for reply in server.submit(Request(c, base[c, p], torch.ones(1), final=final, fragment=p)):
            blocked.discard(reply.client)
            if not reply.final:
                base[reply.client, reply.fragment] = reply.version
    assert server.max_staleness <= bound and not blocked


def test_a_checkpoint_round_pauses_every_fragment_and_fragment_0_lets_the_clients_go():
    server = _server(2, 1)
    server.plan_pauses([(1, 4)])                                                     # after 1 period: step 4
    (reply,) = server.submit(Request(0, 0, torch.ones(2), fragment=0))
    assert reply.checkpoint == 4
    assert server.submit(Request(0, 1, None, 0, pause=True, round=4)) == []          # paused: waits for client 1
    (reply,) = server.submit(Request(1, 0, torch.ones(2), fragment=1))               # not held by the paused one
    assert reply.fragment == 1 and reply.version == 1
    (reply,) = server.submit(Request(1, 0, torch.ones(2), fragment=0))
    went = server.submit(Request(1, 2, None, 0, pause=True, round=4))
    assert sorted((r.client, r.fragment, r.checkpoint) for r in went) == [(0, 0, 4), (1, 0, 4)]
    assert all(not s.paused and not s.round for s in server.fragments)               # every fragment's round closed
    state = server.state_dict()
    assert [part["version"] for part in state["fragments"]] == [2, 1]


def test_with_moments_each_fragment_holds_its_parameters_then_their_v_and_the_layout_inverts():
    params = [torch.zeros(2, 3), torch.zeros(4), torch.zeros(2, 4)]
    layout = FragmentLayout.of(params, 2, "layers", 2)
    assert layout.wire == (range(0, 20), range(20, 36))  # 10 parameters and their v, then 8 and theirs
    flat = torch.arange(36.0)  # [parameters 0..17 | v 18..35]
    laid = layout.laid_out(flat)
    assert laid[:20].tolist() == [*range(10), *range(18, 28)] and laid[20:].tolist() == [*range(10, 18), *range(28, 36)]
    assert torch.equal(layout.standard(laid), flat)
    assert FragmentLayout.of(params, 1, "layers", 2).order is None


def test_elastic_clients_join_and_leave_every_fragment_and_a_gone_client_holds_no_bound():
    server = _server(0, 0)  # an elastic host starts with no clients; bound 0: every update waits for all running
    assert server.join(0, [0, 0]) == [] and server.join(1, [0, 0]) == []
    assert server.base == {0: [0, 0], 1: [0, 0]}
    whole = server.current(1)
    assert whole.fragment == -1 and whole.model.numel() == 4 and not whole.final
    assert server.submit(Request(0, 0, torch.tensor([1.0, 1.0]), fragment=0)) == []  # held: client 1 computes
    (reply,) = server.leave(1)  # client 1 died: the bound no longer waits for it
    assert (reply.client, reply.fragment, reply.version) == (0, 0, 1)
    assert server.base == {0: [1, 0]} and server.clients == [0]
    # client 1 restarted: a newcomer at each fragment's current version; its finals count every fragment again
    assert server.join(1, server.versions) == [] and server.base[1] == [1, 0] and server.finals_left[1] == 2


def test_a_client_rejoining_after_some_final_pushes_is_waited_for_in_the_other_fragments_only():
    server = _server(0, 4)
    server.join(0, [0, 0])
    server.join(1, [0, 0])
    (ack,) = server.submit(Request(0, 0, torch.tensor([1.0, 1.0]), final=True, fragment=1))
    assert ack.model.numel() == 0
    # client 0's host was lost; at the elected host it joins with fragment 1 done: only fragment 0 waits for it
    assert server.join(0, [0, None]) == [] and server.base[0] == [0, None] and server.finals_left[0] == 1
    assert server.submit(Request(0, 0, None, final=True, fragment=0)) == []  # its last: held for the end
    (ack,) = server.submit(Request(1, 0, None, final=True, fragment=0))  # not client 1's last: acknowledged
    assert ack.client == 1 and ack.model.numel() == 0
    replies = server.submit(Request(1, 0, None, final=True, fragment=1))
    assert sorted(r.client for r in replies) == [0, 1] and all(r.final and r.model.numel() == 4 for r in replies)


def test_an_elected_fragment_server_takes_up_each_fragments_version_count_and_live_bases():
    server = _server(0, 2)
    server.start_from([5, 3], [9, 4], {0: [5, 3], 1: [4, 2]}, {1: [4, None]})
    assert server.versions == [5, 3] and server.counts == [9, 4] and server.updates == 9
    assert server.base == {1: [4, None]} and server.applied == {0: [5, 3], 1: [4, 2]}
    assert server.finals_left == {1: 1} and server.senders() == [1]
    state = server.model_state()
    assert state["versions"] == [5, 3] and len(state["optimizer"]["fragments"]) == 2
