"""What lets the exchanges run beside GPU training: host copies of the gradients, gradients written back
onto the parameter's device, the compute timer's device sync, and the backends that can carry host
tensors (geotrain.sync.base)."""

from __future__ import annotations

import pytest
import torch

from geotrain.sync.base import ComputeTimer, SyncError, check_host_backend, host_gradients, set_grads


def test_host_gradients_are_the_cpu_gradients_themselves_and_zeros_where_missing():
    with_grad, without = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, 2))
    with_grad.grad = torch.full((3,), 2.0)
    grads = host_gradients([with_grad, without])
    assert grads[0] is with_grad.grad  # no copy on the CPU: the CPU path is unchanged
    assert grads[1].shape == (2, 2) and not grads[1].any() and grads[1].device.type == "cpu"


def test_set_grads_creates_the_gradient_on_the_parameters_device_as_a_copy():
    param = torch.nn.Parameter(torch.zeros(4))
    value = torch.arange(4.0)
    set_grads([param], [value])
    assert param.grad.device == param.device and param.grad is not value
    value.add_(1)  # the gradient is a copy: later changes to the exchange's buffer do not reach it
    assert param.grad.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_compute_timer_waits_for_the_device_before_and_after_the_timed_work():
    calls = []
    timer = ComputeTimer(device_sync=lambda: calls.append("sync"))
    with timer:
        calls.append("work")
    assert calls == ["sync", "work", "sync"] and timer.seconds > 0


@pytest.mark.parametrize("backend, refused", [("gloo", False), ("cpu:gloo,cuda:nccl", False),
                                              ("geotrain_emulate", False), ("nccl", True), ("NCCL", True)])
def test_exchanges_need_a_backend_that_takes_host_tensors(backend, refused):
    if not refused:
        check_host_backend(backend, "DiLoCo")
        return
    with pytest.raises(SyncError, match="carries GPU tensors only.*cpu:gloo,cuda:nccl"):
        check_host_backend(backend, "DiLoCo")

