"""Where DiLoCo's outer state lives: beside the parameters ("device") or in host memory ("host").

The outer state is what an outer sync keeps between its syncs and uses at them: the anchor (the model the
replicas last agreed on), the outer Nesterov momentum, the fp32 outer gradients and means it exchanges (the
shadows' gradients), the first-moment anchor of moment sync, an eager landing's proxy and a settled sync's
means. The codecs' error-feedback residuals are on the host in either case: every exchange encodes host copies
of what it sends (geotrain.sync.base.host_gradients).

"host" (as INTELLECT-1 kept it): the accelerator holds only the model, its gradients and the inner optimizer's
state. At a sync each parameter is copied to the host on its own (`on_state`: one tensor at a time, into pinned
memory when it is on CUDA, non_blocking, and the copying stream synchronised before the host reads it), the outer
gradient is formed there against the host anchor, and the new values go back tensor by tensor: no full extra copy
of the model is ever made on the device. On the CPU the two places are one: "host" then runs the same arithmetic
on the same tensors as "device", and the results are bit for bit the same (tested). The CUDA path has not run on
a GPU (benchmarks/cuda/check.sh holds its check).
"""

from __future__ import annotations

from typing import Any

import torch

from geotrain.cost.memory import OUTER_STATES
from geotrain.optim.shards import local_shard


def check_outer_state(value: Any, who: str) -> str:
    """`value` if it is one of OUTER_STATES (geotrain.cost.memory), else ValueError naming `who` (the caller's setting)."""
    if value not in OUTER_STATES:
        raise ValueError(f"{who} must be one of {', '.join(OUTER_STATES)}, got {value!r}")
    return value


def state_device(tensor: torch.Tensor, outer_state: str) -> torch.device:
    """The device the outer state of `tensor` (a parameter, its moments) lives on: the host, or its own."""
    return torch.device("cpu") if outer_state == "host" else tensor.device


def on_state(tensor: torch.Tensor, outer_state: str) -> torch.Tensor:
    """`tensor`'s local shard (geotrain.optim.shards) where the outer state lives, to read: the shard itself (no
    copy) when it is already there, else a host copy of this one tensor (pinned and non_blocking from CUDA, with the
    stream synchronised before it is returned)."""
    local = local_shard(tensor)
    if outer_state != "host" or local.device.type == "cpu":
        return local
    return _host_copy(local, local.dtype)


def state_copy(tensor: torch.Tensor, outer_state: str) -> torch.Tensor:
    """A new fp32 tensor of `tensor`'s local shard values where the outer state lives (an anchor)."""
    local = local_shard(tensor)
    if outer_state != "host" or local.device.type == "cpu":
        return local.clone().float()
    return _host_copy(local, torch.float32)


def _host_copy(local: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A host copy of device tensor `local` as `dtype`: pinned and non_blocking from CUDA, the stream synchronised
    before it is returned (the host reads it next)."""
    if local.device.type != "cuda":
        return local.to("cpu", dtype, copy=True)
    copy = torch.empty(local.shape, dtype=dtype, pin_memory=True)
    copy.copy_(local, non_blocking=True)
    torch.cuda.current_stream(local.device).synchronize()
    return copy
