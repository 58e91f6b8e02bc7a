"""A posted exchange settled at a checkpoint (geotrain.sync.settle): waited for once, its means kept and written
back at its landing (the bytes it handed when posted), through a state dict too; a state of other shapes refused."""

from __future__ import annotations

import pytest
import torch

from geotrain.sync.base import ComputeTimer
from geotrain.sync.settle import Delivered, redeliver, settle


def _shadows(*shapes: tuple[int, ...]) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(shape), requires_grad=False) for shape in shapes]


def test_a_settled_exchange_lands_its_means_later_and_after_a_state_round_trip():
    shadows = _shadows((2, 3), (4,))
    waits = []

    def land(timer) -> int:  # the posted collective's landing: writes the means, returns the bytes handed
        waits.append(1)
        for i, p in enumerate(shadows):
            p.grad = torch.full(p.shape, float(i + 1))
        return 96

    delivered = settle(land, ComputeTimer(), [shadows])
    for p in shadows:
        p.grad.zero_()  # whatever happens to the gradients before the landing step
    assert redeliver(delivered, [shadows])(ComputeTimer()) == 96 and waits == [1]
    assert [float(p.grad.mean()) for p in shadows] == [1.0, 2.0]
    restored = _shadows((2, 3), (4,))  # a resumed run's fresh shadows
    assert redeliver(Delivered.of(delivered.state_dict()), [restored])(ComputeTimer()) == 96
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(shadows, restored))
    with pytest.raises(ValueError, match="does not match this sync's parameters"):
        redeliver(Delivered.of(delivered.state_dict()), [_shadows((3, 2), (4,))])
