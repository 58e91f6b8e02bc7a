"""The data-parallel gradient exchange of one stage's group, through any codec, with error feedback.

Each member flattens its stage's gradients, divides by the group size R and encodes them (with its
error-feedback residual added first, if on), so that the sum of the R decoded payloads is the mean
gradient. Summable codecs (none, fp16, bf16, randk...) sum their payload buffers in compressed form
with one all-reduce per buffer; the others all-gather the packed payloads and every member decodes
and sums all R of them in rank order (so every member gets bit-identical gradients). The collective
runs inside Transport.collective, which emulates the cost model's all-reduce time for the payload
bytes (for an all-gather this charges the same time: documented in docs/runtime.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from geotrain.codecs.base import Codec, Payload
from geotrain.codecs.wire import pack_payload, unpack_payload
from geotrain.ddp.powersgd import PowerSGDConfig, PowerSGDLayout, PowerSGDReducer
from geotrain.runtime.transport import Transport


class GradientExchange:
    """Averages the gradients of `params` over a DP group; holds the error-feedback residual."""

    def __init__(self, params: Sequence[torch.nn.Parameter], codec: Codec, error_feedback: Any | None,
                 transport: Transport, group: Any, group_devices: list[int]) -> None:
        """`error_feedback`: an ErrorFeedback wrapping `codec` (its encode adds and updates the
        residual), or None to encode plainly."""
        self.params = list(params)
        self.codec = codec
        self.error_feedback = error_feedback
        self.transport = transport
        self.group = group
        self.group_devices = group_devices
        self.group_size = len(group_devices)
        self.numel = sum(p.numel() for p in self.params)
        self.last_nbytes = 0

    def _flat_gradient(self) -> torch.Tensor:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        return torch.cat([g.reshape(-1) for g in grads]).to(torch.float32)

    def _encode(self, flat: torch.Tensor, step: int) -> Payload:
        self.codec.set_step(step)
        if self.error_feedback is not None:
            return self.error_feedback.encode(flat)
        return self.codec.encode(flat)

    def _communicate(self, payload: Payload) -> Payload | list[torch.Tensor]:
        """The real collective: the summed payload (summable codecs) or all members' packed payloads."""
        if self.codec.summable:
            for buffer in payload.buffers.values():
                dist.all_reduce(buffer, group=self.group)
            return payload
        packed = pack_payload(payload)
        gathered = [torch.empty_like(packed) for _ in range(self.group_size)]
        dist.all_gather(gathered, packed, group=self.group)
        return gathered

    def _decode(self, received: Payload | list[torch.Tensor], spec: Any) -> torch.Tensor:
        if isinstance(received, Payload):
            return self.codec.decode(received).to(torch.float32)
        total = torch.zeros(self.numel, dtype=torch.float32)
        for data in received:  # rank order: every member sums in the same order
            total += self.codec.decode(unpack_payload(data, spec)).to(torch.float32).reshape(-1)
        return total

    def exchange(self, step: int, timer: Any) -> int:
        """Replace every gradient by the group mean (as the codec delivers it); returns payload bytes.
        Encoding and decoding are timed by `timer` (compute); the collective by the transport."""
        with timer:
            flat = self._flat_gradient() / self.group_size
            payload = self._encode(flat, step)
            spec = payload.spec()
        self.last_nbytes = payload.nbytes
        if self.group_size < 2:
            received: Payload | list[torch.Tensor] = payload
            self.transport.collective(self.group, self.group_devices, payload.nbytes, lambda: None)
        else:
            received = self.transport.collective(self.group, self.group_devices, payload.nbytes,
                                                 lambda: self._communicate(payload))
        with timer:
            mean = self._decode(received, spec).reshape(-1)
            offset = 0
            for p in self.params:
                chunk = mean[offset:offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = chunk.clone()
                else:
                    p.grad.copy_(chunk)
                offset += p.numel()
        return payload.nbytes

    def state_dict(self) -> dict[str, Any]:
        return {"error_feedback": None if self.error_feedback is None else self.error_feedback.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("error_feedback") is None) != (self.error_feedback is None):
            raise ValueError("checkpoint and run disagree on error feedback (on in one, off in the other)")
        if self.error_feedback is not None:
            self.error_feedback.load_state_dict(state["error_feedback"])


class PowerSGDGradientExchange:
    """`--dp-codec powersgd`: distributed PowerSGD over the stage's DP group (the algorithm of
    `geotrain.ddp`'s hook: all-reduce P, then Q, shared basis, error feedback). Each of the two
    all-reduces goes through Transport.collective, so each is emulated with its own bytes."""

    def __init__(self, named_params: Sequence[tuple[str, torch.nn.Parameter]], config: PowerSGDConfig,
                 transport: Transport, group: Any, group_devices: list[int]) -> None:
        self.params = [param for _, param in named_params]
        self.transport = transport
        self.group = group
        self.group_devices = group_devices
        layout = PowerSGDLayout.build([(name, param.shape) for name, param in named_params], config)
        self.reducer = PowerSGDReducer(layout, config, world_size=len(group_devices), local_workers=1)
        self.last_nbytes = 0

    def _all_reduce(self, flats: list[torch.Tensor]) -> torch.Tensor:
        flat = flats[0]
        nbytes = flat.numel() * flat.element_size()
        self.last_nbytes += nbytes
        if len(self.group_devices) < 2:
            self.transport.collective(self.group, self.group_devices, nbytes, lambda: None)
            return flat
        self.transport.collective(self.group, self.group_devices, nbytes,
                                  lambda: dist.all_reduce(flat, group=self.group))
        return flat

    def exchange(self, step: int, timer: Any) -> int:
        """Replace every gradient by the group's PowerSGD mean; returns the bytes handed to the
        all-reduces. The matrix products run inside the reducer, between the two collectives, so
        they are timed neither as compute (`timer`) nor as communication (the transport)."""
        self.last_nbytes = 0
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        means = self.reducer.reduce([grads], self._all_reduce)
        with timer:
            for p, mean in zip(self.params, means, strict=True):
                if p.grad is None:
                    p.grad = mean.clone()
                else:
                    p.grad.copy_(mean)
        return self.last_nbytes

    def state_dict(self) -> dict[str, Any]:
        return {"powersgd": self.reducer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "powersgd" not in state:
            raise ValueError("checkpoint was written with another gradient codec than powersgd")
        self.reducer.load_state_dict(state["powersgd"])
