"""A pipeline cut's packed wire: a quantising codec applied to activations and their gradients.

The sending stage ends in `send` (its output becomes a float32 carrier of the codec's packed bytes,
geotrain.codecs.carrier) and the receiving stage starts with `receive` (the carrier decoded back to
activations). torch.distributed.pipelining moves the carrier both ways like any float tensor:

    forward   sender: activations -> encode -> carrier ==> receiver: carrier -> decode -> activations
    backward  sender: decode <- carrier-shaped gradient <== receiver: encode <- activation gradient

So the activation gradients are compressed by the same codec on the way back, and the gradient the
receiver returns has exactly the carrier's shape (what the schedule expects). Both functions are
stateless: no error feedback, because a cut's activations and gradients belong to different samples
every micro-batch (a residual carried from one sample into another's would be noise, not a correction).
AQ-SGD-style per-sample deltas, whose state is each sample's last activation on both sides of the cut,
are runtime/delta_wire.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from geotrain.codecs import Codec, CodecSpec, PayloadSpec
from geotrain.codecs.carrier import carried_spec, carrier_numel, decode_from_carrier, encode_to_carrier


@dataclass(frozen=True)
class PackedWire:
    """Cut codec `spec` (one of geotrain.codecs.carrier.CARRIED_CODECS), carried in float32."""

    spec: CodecSpec
    codec: Codec = field(init=False, compare=False, repr=False)
    _specs: dict[tuple[int, ...], PayloadSpec] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", self.spec.build())

    def __str__(self) -> str:
        return str(self.spec)

    def carrier_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The carrier's shape for activations of `shape` (batch first)."""
        return (shape[0], carrier_numel(self.codec, shape[1:]))

    def payload_spec(self, sample_shape: tuple[int, ...]) -> PayloadSpec:
        """One sample's payload spec (derived once per shape)."""
        key = tuple(int(n) for n in sample_shape)
        if key not in self._specs:
            self._specs[key] = carried_spec(self.codec, key)
        return self._specs[key]

    def send(self, hidden: torch.Tensor) -> torch.Tensor:
        """`hidden` (batch first) as a carrier; its gradient is decoded from the carrier's gradient."""
        return _Send.apply(hidden, self)

    def receive(self, carrier: torch.Tensor, sample_shape: tuple[int, ...]) -> torch.Tensor:
        """The activations a carrier holds (batch, *sample_shape); their gradient goes back encoded."""
        return _Receive.apply(carrier, self, tuple(sample_shape))


class _Send(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, wire: PackedWire) -> torch.Tensor:  # type: ignore[override]
        ctx.wire, ctx.sample_shape = wire, tuple(hidden.shape[1:])
        return encode_to_carrier(wire.codec, hidden.detach().float())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return decode_from_carrier(ctx.wire.codec, grad, ctx.wire.payload_spec(ctx.sample_shape)), None


class _Receive(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, carrier: torch.Tensor, wire: PackedWire,  # type: ignore[override]
                sample_shape: tuple[int, ...]) -> torch.Tensor:
        ctx.wire = wire
        return decode_from_carrier(wire.codec, carrier, wire.payload_spec(sample_shape))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        return encode_to_carrier(ctx.wire.codec, grad.float()), None, None
