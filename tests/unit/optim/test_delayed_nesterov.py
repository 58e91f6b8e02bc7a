"""Delayed Nesterov (geotrain.optim.delayed_nesterov) against hand computations and torch's Nesterov SGD."""

from __future__ import annotations

import pytest
import torch

from geotrain.optim.delayed_nesterov import DelayedNesterov, staleness_weight
from geotrain.optim.outer import OuterStepError


def test_period_one_is_torch_nesterov_sgd():
    torch.manual_seed(0)
    start = torch.randn(6)
    gradients = [torch.randn(6) for _ in range(4)]
    theta = start.clone()
    dn = DelayedNesterov(period=1, lr=0.7, momentum=0.9, staleness_power=0.0)
    reference = torch.nn.Parameter(start.clone())
    sgd = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=True)
    for g in gradients:
        dn.step(theta, g)
        reference.grad = g.clone()
        sgd.step()
    torch.testing.assert_close(theta, reference.detach(), rtol=1e-6, atol=1e-6)


def test_n_fresh_arrivals_make_one_nesterov_step_on_their_mean():
    torch.manual_seed(1)
    theta = torch.randn(5)
    reference = torch.nn.Parameter(theta.clone())
    sgd = torch.optim.SGD([reference], lr=0.5, momentum=0.8, nesterov=True)
    dn = DelayedNesterov(period=3, lr=0.5, momentum=0.8, staleness_power=0.0)
    for _ in range(2):  # two rounds: the second uses the momentum the first left
        round_ = [torch.randn(5) for _ in range(3)]
        for g in round_:
            dn.step(theta, g)
        reference.grad = torch.stack(round_).mean(0)
        sgd.step()
        torch.testing.assert_close(theta, reference.detach(), rtol=1e-6, atol=1e-6)


def test_hand_computation_with_staleness_weights():
    # period 2, lr 0.5, beta 0.9, power 1: weights 1/(1+s)
    theta = torch.tensor([1.0, -2.0])
    dn = DelayedNesterov(period=2, lr=0.5, momentum=0.9, staleness_power=1.0)
    w = dn.step(theta, torch.tensor([2.0, 4.0]), staleness=1)          # weight 0.5: g' = [1, 2]
    assert w == 0.5
    torch.testing.assert_close(theta, torch.tensor([1.0 - 0.5 * 0.5, -2.0 - 0.5 * 1.0]))  # theta -= lr g'/2
    dn.step(theta, torch.tensor([3.0, 0.0]), staleness=2)               # weight 1/3: g' = [1, 0]
    # momentum = 0.9 * 0 + ([1, 2] + [1, 0]) / 2 = [1, 1]; theta -= 0.5 ([1, 0] / 2 + 0.9 [1, 1])
    torch.testing.assert_close(theta, torch.tensor([0.75 - 0.5 * (0.5 + 0.9), -2.5 - 0.5 * 0.9]))
    torch.testing.assert_close(dn.momentum_buffer, torch.tensor([1.0, 1.0]))
    # third arrival: no momentum update, plain weighted step
    dn.step(theta, torch.tensor([2.0, 2.0]), staleness=0)
    torch.testing.assert_close(theta, torch.tensor([0.05 - 0.5, -2.95 - 0.5]))


def test_staleness_weight_and_bad_settings_are_named():
    assert staleness_weight(0, 0.5) == 1.0
    assert staleness_weight(3, 0.5) == pytest.approx(0.5)
    with pytest.raises(OuterStepError, match="staleness must be >= 0"):
        staleness_weight(-1, 0.5)
    with pytest.raises(OuterStepError, match="period must be an integer >= 1, got 0"):
        DelayedNesterov(period=0)
    with pytest.raises(OuterStepError, match="momentum must be a finite number in \\[0, 1\\), got 1.0"):
        DelayedNesterov(period=2, momentum=1.0)
