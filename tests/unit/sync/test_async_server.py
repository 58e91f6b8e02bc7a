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
