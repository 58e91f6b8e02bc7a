"""The global model's rule of asynchronous DiLoCo (geotrain.sync.async_server): arrivals applied at once,
the staleness bound held by holding fast clients, a tight bound resolved by one merged update, the end."""

from __future__ import annotations

import pytest
import torch

from geotrain.optim.delayed_nesterov import DelayedNesterov
from geotrain.sync.async_server import OuterServer, Request
from geotrain.sync.base import SyncError


def _server(clients: int, bound: int) -> OuterServer:
    # lr 1, no momentum, period 1, no staleness weight: theta -= g, easy to follow
    return OuterServer(torch.zeros(2), DelayedNesterov(1, 1.0, 0.0, 0.0), list(range(clients)), bound)


def _g(value: float) -> torch.Tensor:
    return torch.full((2,), value)


def test_an_arrival_is_applied_and_answered_without_waiting_for_the_others():
    server = _server(3, 8)
    replies = server.submit(Request(1, 0, _g(1.0)))
    assert [(r.client, r.version, r.updates) for r in replies] == [(1, 1, 1)]
    torch.testing.assert_close(replies[0].model, _g(-1.0))
    replies = server.submit(Request(1, 1, _g(2.0)))
    assert [(r.client, r.version) for r in replies] == [(1, 2)]
    torch.testing.assert_close(server.model, _g(-3.0))


def test_a_fast_client_is_held_at_the_bound_until_the_slow_one_arrives():
    server = _server(2, 2)  # client 0 fast, client 1 slow (still at base 0)
    assert len(server.submit(Request(0, 0, _g(1.0)))) == 1   # version 1, staleness of client 1 would be 1
    assert len(server.submit(Request(0, 1, _g(1.0)))) == 1   # version 2: client 1 now 2 behind
    assert server.submit(Request(0, 2, _g(1.0))) == []       # a third would put client 1 at 3 > 2: held
    assert server.version == 2
    replies = server.submit(Request(1, 0, _g(10.0)))         # the slow one arrives, staleness 2 (bound held)
    assert [(r.client, r.version) for r in replies] == [(1, 3), (0, 4)]
    assert server.max_staleness == 2
    torch.testing.assert_close(server.model, _g(-13.0))


def test_bound_zero_is_synchronous_one_mean_update_per_round():
    server = _server(3, 0)
    assert server.submit(Request(0, 0, _g(3.0))) == []
    assert server.submit(Request(2, 0, _g(6.0))) == []
    replies = server.submit(Request(1, 0, _g(0.0)))
    assert sorted(r.client for r in replies) == [0, 1, 2] and {r.version for r in replies} == {1}
    torch.testing.assert_close(server.model, _g(-3.0))      # the mean, once


def test_every_client_gets_the_same_final_model_after_the_last_final():
    server = _server(2, 1)
    assert server.submit(Request(0, 0, _g(1.0), final=True)) == []    # applied, reply held for the end
    replies = server.submit(Request(1, 0, None, final=True))          # nothing to add
    assert sorted(r.client for r in replies) == [0, 1]
    assert all(r.final and r.version == 1 for r in replies)
    assert torch.equal(replies[0].model, replies[1].model)


def test_a_request_from_a_wrong_base_is_refused():
    server = _server(2, 4)
    with pytest.raises(SyncError, match="client 1 sent base 3, but was given version 0"):
        server.submit(Request(1, 3, _g(1.0)))


def test_gradients_past_the_budget_are_not_applied_and_their_clients_see_it_spent():
    server = OuterServer(torch.zeros(2), DelayedNesterov(1, 1.0, 0.0, 0.0), [0, 1], 8, budget=2)
    server.submit(Request(0, 0, _g(1.0)))
    server.submit(Request(0, 1, _g(1.0)))  # the budget is spent: 2 replica outer gradients
    late = server.submit(Request(1, 0, _g(5.0)))  # client 1 was mid-period: its gradient comes too late
    assert [(r.client, r.updates) for r in late] == [(1, 2)]  # it sees the budget spent, and stops
    torch.testing.assert_close(server.model, _g(-2.0))
    assert server.discarded == 1 and server.applied == {0: 2, 1: 0} and server.version == 2
    with pytest.raises(SyncError, match="budget must be an integer >= 1"):
        OuterServer(torch.zeros(2), DelayedNesterov(1, 1.0, 0.0, 0.0), [0], 8, budget=0)


def test_a_checkpoint_round_pauses_each_client_at_its_next_reply_and_lets_all_go_together():
    """pauses (2 updates, step 5): the reply that makes the second update says checkpoint 5; a paused client does
    not hold the bound (client 1 at base 0 would otherwise hold client 0's third arrival), and once both are
    paused both are told to go on, with their models unchanged; the next round opens at its own count."""
    server = OuterServer(torch.zeros(2), DelayedNesterov(1, 1.0, 0.0, 0.0), [0, 1], 1, pauses=[(2, 5), (4, 7)])
    assert [r.checkpoint for r in server.submit(Request(0, 0, _g(1.0)))] == [0]
    assert [(r.client, r.checkpoint) for r in server.submit(Request(1, 0, _g(1.0)))] == [(1, 5)]
    assert server.submit(Request(1, 2, None, 0, pause=True)) == []     # client 0 still computing from version 1
    replies = server.submit(Request(0, 1, _g(1.0)))                    # staleness 2 > 1, but client 1 is paused
    assert [(r.client, r.version, r.checkpoint) for r in replies] == [(0, 3, 5)]
    go = server.submit(Request(0, 3, None, 0, pause=True))
    assert sorted((r.client, r.version, r.checkpoint) for r in go) == [(0, 3, 5), (1, 3, 5)]
    assert server.round == 0 and server.base == {0: 3, 1: 2}          # a pause leaves a client's base as it was
    saved = server.state_dict()
    again = OuterServer(torch.zeros(2), DelayedNesterov(1, 1.0, 0.0, 0.0), [0, 1], 1)
    again.load_state_dict(saved)
    again.plan_pauses([(4, 7)])
    for one in (server, again):                                        # the restored server continues alike
        replies = one.submit(Request(1, 2, _g(2.0)))
        assert [(r.client, r.version, r.updates, r.checkpoint) for r in replies] == [(1, 4, 4, 7)]
    torch.testing.assert_close(again.model, server.model)
    with pytest.raises(SyncError, match="requests waiting"):
        one = OuterServer(torch.zeros(2), DelayedNesterov(1, 1.0, 0.0, 0.0), [0, 1], 0)
        assert one.submit(Request(0, 0, _g(1.0))) == []  # held (bound 0): client 1 has not arrived
        one.state_dict()


def test_a_region_server_waits_for_its_release_and_its_clients_go_with_the_step_it_names():
    """A relay server (a region's: sync/async_region.py): its count reaching a pause opens the round; with every
    client paused it answers nothing until `release`, whose step (the global server's go) the clients go with."""
    region = OuterServer(torch.zeros(2), DelayedNesterov(1, 1.0, 0.0, 0.0), [0, 1], 4, pauses=[(2, 3), (6, 9)],
                         relay=True)
    assert [r.checkpoint for r in region.submit(Request(0, 0, _g(1.0)))] == [0]
    assert [r.checkpoint for r in region.submit(Request(1, 0, _g(1.0)))] == [3]     # 2 updates: the round of step 3
    assert region.submit(Request(1, 2, None, 0, pause=True, round=3)) == [] and not region.all_paused()
    assert [r.checkpoint for r in region.submit(Request(0, 1, _g(1.0)))] == [3]
    assert region.submit(Request(0, 3, None, 0, pause=True, round=3)) == []        # held for the region's pause
    assert region.all_paused() and region.closing_round() == 3 and region.senders() == []
    go = region.release(5)                                                           # the global server closed 5
    assert sorted((r.client, r.checkpoint) for r in go) == [(0, 5), (1, 5)]
    assert region.round == 0 and region.closed == 5 and region.pauses == [(6, 9)]


def test_a_pause_naming_a_round_opens_it_for_the_other_clients_and_the_go_names_the_largest():
    """The global server of regions: a region's pause names its round (7), so the other region's next reply says 7;
    a merge answer naming a round (join_round) opens it likewise; a closed round opens nothing again."""
    top = OuterServer(torch.zeros(2), DelayedNesterov(1, 1.0, 0.0, 0.0), [0, 2], 4)
    assert top.submit(Request(0, 0, None, 0, pause=True, round=7)) == []
    assert top.round == 7 and top.senders() == [2]                                  # a paused region sends nothing
    assert [(r.client, r.checkpoint) for r in top.submit(Request(2, 0, _g(1.0), 2))] == [(2, 7)]
    go = top.submit(Request(2, 1, None, 0, pause=True, round=8))
    assert sorted((r.client, r.checkpoint) for r in go) == [(0, 8), (2, 8)]
    top.join_round(8)
    assert top.round == 0                                                           # 8 has closed
    top.join_round(9)
    assert top.round == 9 and top.state_dict()["closed"] == 8


def test_a_client_that_leaves_releases_the_one_it_held_and_the_finals():
    server = _server(2, 1)  # client 1 dies while computing from version 0
    assert len(server.submit(Request(0, 0, _g(1.0)))) == 1   # version 1: client 1 one behind
    assert server.submit(Request(0, 1, _g(1.0))) == []       # held: client 1 would be 2 behind
    replies = server.leave(1)                                # its connection is gone: not waited for
    assert [(r.client, r.version) for r in replies] == [(0, 2)]
    finals = server.submit(Request(0, 2, None, final=True))  # the last running client's final: answered at once
    assert [(r.client, r.final) for r in finals] == [(0, True)]


def test_a_joining_client_starts_at_its_base_and_an_elected_copy_goes_on_from_its_version():
    server = _server(0, 8)
    server.start_from(5, 9, {0: 4})                          # the freshest copy: version 5, 9 updates
    assert server.join(1, 3) == [] and server.join(0, 7) == []
    assert server.base == {1: 3, 0: 5}                        # a base past the copy's version is the copy's
    replies = server.submit(Request(1, 3, _g(1.0)))           # its staleness counts against this server: 5 - 3
    assert [(r.client, r.version, r.updates) for r in replies] == [(1, 6, 10)]
    assert server.max_staleness == 2 and server.applied == {0: 4, 1: 1}


def test_a_server_started_from_a_copy_with_bases_holds_a_fast_client_at_the_bound():
    """An elected server restores the copy's bases of the live clients: the fast client is held at S = 2 until the
    slow restored one (computing since version 4) arrives; its join does not let the fast one through first."""
    server = _server(0, 2)
    server.start_from(5, 9, {0: 4, 1: 5}, {0: 4, 1: 5})        # the copy: version 5, client 0 still at base 4
    assert [(r.client, r.version) for r in server.submit(Request(1, 5, _g(1.0)))] == [(1, 6)]  # 5 - 4 < 2
    assert server.submit(Request(1, 6, _g(1.0))) == []       # held: one more update puts client 0 3 behind
    assert server.join(0, 4) == [] and server.version == 6   # it (re)connects with its gradient from base 4
    replies = server.submit(Request(0, 4, _g(1.0)))          # applied at staleness 2, then the fast one at 1
    assert [(r.client, r.version) for r in replies] == [(0, 7), (1, 8)]
    assert server.max_staleness == 2 and server.base == {0: 7, 1: 8}


def test_the_models_state_is_taken_with_requests_waiting_and_a_server_started_from_it_keeps_its_momentum():
    """An elastic run's checkpoint (runtime/elastic/async_checkpoint.py) takes `model_state` whatever waits (the
    waiting request is lost, as a client's work in progress); a server started from it with its outer optimizer's
    state goes on as the uninterrupted one: the same model after the next update (momentum 0.9 carried; from zero
    momentum the model differs)."""
    def nesterov() -> DelayedNesterov:
        return DelayedNesterov(1, 0.5, 0.9, 0.0)

    server = OuterServer(torch.zeros(2), nesterov(), [0, 1], 1)
    assert len(server.submit(Request(0, 0, _g(1.0)))) == 1
    assert server.submit(Request(0, 1, _g(5.0))) == []  # held by the bound: client 1 still at version 0
    with pytest.raises(SyncError, match="requests waiting"):
        server.state_dict()
    state = server.model_state()
    assert (state["version"], state["updates"]) == (1, 1)
    reference = OuterServer(torch.zeros(2), nesterov(), [0], 8)
    reference.submit(Request(0, 0, _g(1.0)))
    reference.submit(Request(0, 1, _g(3.0)))
    models = []
    for carried in (True, False):
        optimizer = nesterov()
        if carried:
            optimizer.load_state_dict(state["optimizer"])
        resumed = OuterServer(state["model"], optimizer, [], 1)
        resumed.start_from(state["version"], state["updates"], {})
        resumed.join(0, state["version"])
        assert [(r.version, r.updates) for r in resumed.submit(Request(0, 1, _g(3.0)))] == [(2, 2)]
        models.append(resumed.model)
    torch.testing.assert_close(models[0], reference.model)
    assert not torch.allclose(models[1], reference.model)
