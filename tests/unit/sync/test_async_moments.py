"""The asynchronous server's merge of AdamW second moments (geotrain.sync.async_moments): a push carries the
replica's v, and the server's v moves toward it by the arrival's staleness weight / N (a convex step), beside delayed
Nesterov on the parameters; a replica's AdamW loads the second moments a reply carries and keeps its own first
moments."""

from __future__ import annotations

import random

import pytest
import torch

from geotrain.optim.delayed_nesterov import DelayedNesterov
from geotrain.sync.async_moments import MomentMerge, flat_moments, load_moments, loads_moments, push_of
from geotrain.sync.async_server import OuterServer, Request
from geotrain.sync.base import SyncError

N = 2  # parameters


def _push(model: torch.Tensor, theta: list[float], v: list[float]) -> torch.Tensor:
    """A replica's push from base `model` (what it received) holding theta and v now."""
    return push_of(model, torch.tensor([*theta, *v]), N)


def test_a_fresh_arrival_pulls_v_half_way_with_two_clients_and_a_stale_one_by_its_weight():
    base = torch.tensor([1.0, 2.0, 0.0, 0.0])  # parameters, zero second moments (AdamW's start)
    server = OuterServer(base, MomentMerge(DelayedNesterov(2, lr=1.0, momentum=0.0, staleness_power=1.0), N, 2),
                         [0, 1], staleness_bound=4)
    # replica 0: base 0, fresh (weight 1): v moves 1/2 of the way to its v, parameters by 1/2 of its outer gradient
    server.submit(Request(0, 0, _push(base, [0.8, 2.2], [0.04, 0.02])))
    torch.testing.assert_close(server.model, torch.tensor([0.9, 2.1, 0.02, 0.01]), rtol=0, atol=1e-7)
    # replica 1: base 0, one update stale (weight (1 + 1) ** -1 = 1/2): v moves 1/4 of the way to its v
    server.submit(Request(1, 0, _push(base, [1.2, 1.8], [0.08, 0.0])))
    torch.testing.assert_close(server.model, torch.tensor([0.9 + 0.05, 2.1 - 0.05, 0.02 + 0.015, 0.01 - 0.0025]),
                               rtol=0, atol=1e-7)


def test_stale_arrivals_in_any_order_keep_v_between_the_replicas_v():
    """The first build sent v as a delta from the replica's base: stale deltas added up and drove the server's v to 0
    under some arrival orders (a replica that loaded it then stepped AdamW by m / eps). A convex step cannot."""
    rng = random.Random(0)
    server = OuterServer(torch.tensor([0.0, 0.0, 0.5, 0.5]), MomentMerge(DelayedNesterov(4, lr=1.0, momentum=0.0), N, 4),
                         [0, 1, 2, 3], staleness_bound=8)
    bases = [0, 0, 0, 0]
    for _ in range(200):
        client = rng.randrange(4)
        v = [rng.uniform(0.4, 0.6), rng.uniform(0.4, 0.6)]
        base = torch.tensor([0.0, 0.0, 0.5, 0.5])  # a base the server has long left: the arrival is stale
        replies = server.submit(Request(client, bases[client], _push(base, [0.0, 0.0], v)))
        for reply in replies:
            bases[reply.client] = reply.version
        assert all(0.4 <= x <= 0.6 for x in server.model[N:].tolist()), server.model
    assert server.updates == 200


def test_one_client_takes_the_arrivals_v_and_a_wrong_size_is_refused():
    merge = MomentMerge(DelayedNesterov(1, lr=1.0, momentum=0.0), N, 1)
    theta = torch.tensor([0.0, 0.0, 0.1, 0.2])
    merge.step(theta, torch.tensor([0.0, 0.0, 0.3, 0.1]))
    assert theta[N:].tolist() == pytest.approx([0.3, 0.1])
    with pytest.raises(SyncError, match="expected 4"):
        merge.step(torch.zeros(6), torch.zeros(6))


def test_a_replica_sends_its_second_moments_and_loads_the_global_ones_keeping_its_first():
    params = [torch.nn.Parameter(torch.ones(2, 1)), torch.nn.Parameter(torch.ones(1))]
    adamw = torch.optim.AdamW(params, lr=0.1)
    for p in params:
        p.grad = torch.full_like(p, 2.0)
    adamw.step()  # m = 0.1 x 2, v = 0.001 x 4
    torch.testing.assert_close(flat_moments(adamw, params), torch.tensor([0.004] * 3))
    load_moments(adamw, params, torch.tensor([0.5, -1.0, 0.25]))
    assert adamw.state[params[0]]["exp_avg_sq"].reshape(-1).tolist() == [0.5, 0.0]  # kept >= 0
    assert adamw.state[params[1]]["exp_avg_sq"].tolist() == [0.25]
    torch.testing.assert_close(adamw.state[params[0]]["exp_avg"], torch.full((2, 1), 0.2))  # its own
    assert not loads_moments(1, 2) and loads_moments(2, 2)
