"""The asynchronous server's merge of AdamW second moments (geotrain.sync.async_moments): the moment part of a push
moves the server's moments by the arrival's staleness weight / N, beside delayed Nesterov on the parameters; a
replica's AdamW loads the second moments a reply carries and keeps its own first moments."""

from __future__ import annotations

import pytest
import torch

from geotrain.optim.delayed_nesterov import DelayedNesterov
from geotrain.sync.async_moments import MomentMerge, flat_moments, load_moments, loads_moments
from geotrain.sync.async_server import OuterServer, Request
from geotrain.sync.base import SyncError

N = 2  # parameters


def _push(model: torch.Tensor, theta: list[float], v: list[float]) -> torch.Tensor:
    """A replica's push from base `model` (what it received) holding theta and v now: base - held, both parts."""
    return model - torch.tensor([*theta, *v])


def test_two_fresh_arrivals_leave_the_mean_moments_and_a_stale_one_counts_by_its_weight():
    base = torch.tensor([1.0, 2.0, 0.0, 0.0])  # parameters, zero second moments (AdamW's start)
    server = OuterServer(base, MomentMerge(DelayedNesterov(2, lr=1.0, momentum=0.0, staleness_power=1.0), N, 2),
                         [0, 1], staleness_bound=4)
    # replica 0: base 0, fresh (weight 1): v moves 1/2 of the way, parameters by 1/2 of its outer gradient
    server.submit(Request(0, 0, _push(base, [0.8, 2.2], [0.04, 0.02])))
    torch.testing.assert_close(server.model, torch.tensor([0.9, 2.1, 0.02, 0.01]), rtol=0, atol=1e-7)
    # replica 1: base 0, one update stale (weight (1 + 1) ** -1 = 1/2): 1/4 of its change from base 0
    server.submit(Request(1, 0, _push(base, [1.2, 1.8], [0.08, 0.0])))
    torch.testing.assert_close(server.model, torch.tensor([0.9 + 0.05, 2.1 - 0.05, 0.02 + 0.02, 0.01]), rtol=0,
                               atol=1e-7)


def test_with_full_weight_n_arrivals_from_one_base_hold_the_synchronous_mean():
    base = torch.tensor([0.0, 0.0, 0.5, 0.5])
    server = OuterServer(base, MomentMerge(DelayedNesterov(3, lr=0.7, momentum=0.9), N, 3), [0, 1, 2], 4)
    held = [([0.1, 0.2], [0.2, 0.9]), ([0.0, 0.1], [0.4, 0.3]), ([0.2, 0.0], [0.9, 0.0])]
    for client, (theta, v) in enumerate(held):
        server.submit(Request(client, 0, _push(base, theta, v)))
    torch.testing.assert_close(server.model[N:], torch.tensor([h[1] for h in held]).mean(0), rtol=0, atol=1e-7)


def test_the_second_moment_stays_non_negative_and_a_wrong_size_is_refused():
    merge = MomentMerge(DelayedNesterov(1, lr=1.0, momentum=0.0), N, 1)
    theta = torch.tensor([0.0, 0.0, 0.1, 0.2])
    merge.step(theta, torch.tensor([0.0, 0.0, 0.3, 0.1]))  # v would be -0.2 and 0.1
    assert theta[N:].tolist() == pytest.approx([0.0, 0.1])
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
