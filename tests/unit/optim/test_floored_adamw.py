"""FlooredAdamW: AdamW when the floor is 0, OneBitAdam's floor and freeze otherwise."""

import torch

from geotrain.optim.floored_adamw import FlooredAdamW


def _params():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))]


def _run(optimizer, params, steps=6):
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator) * (1e-3 if step % 2 else 1.0)
        optimizer.step()


def test_floor_zero_without_freeze_is_torch_adamw():
    ours, theirs = _params(), _params()
    _run(FlooredAdamW(ours, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, variance_floor=0.0), ours)
    _run(torch.optim.AdamW(theirs, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1), theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_floor_raises_small_denominators_and_freeze_keeps_them():
    params = _params()
    optimizer = FlooredAdamW(params, lr=1e-2, variance_floor=0.5, freeze_after=2)
    _run(optimizer, params, steps=2)
    denoms = [optimizer.state[p]["denom"].clone() for p in params]
    for p, denom in zip(params, denoms, strict=True):
        root = (optimizer.state[p]["exp_avg_sq"] / (1 - 0.999 ** 2)).sqrt()
        assert torch.allclose(denom, root.clamp(min=0.5 * float(root.mean())), rtol=1e-6, atol=0)
        assert float(denom.min()) > float(root.min())  # the floor lifted the smallest
    _run(optimizer, params, steps=3)
    assert all(torch.equal(optimizer.state[p]["denom"], d) for p, d in zip(params, denoms, strict=True))
