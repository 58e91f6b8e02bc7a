"""The codec contract: every gradient/activation codec encodes a tensor into the real wire buffers.

    payload = codec.encode(tensor)      # Payload: the tensors that would cross the network
    restored = codec.decode(payload)    # same shape and dtype as the input
    payload.nbytes                      # wire bytes = sum of the buffers' sizes

Metadata (shape, dtype, parameters, a step counter) travels beside the buffers and is not counted:
both sides of a DDP bucket or a pipeline cut know the shapes in advance. Metadata never holds
data-dependent values (scales, counts...: those are buffers), so two workers that encode tensors of
the same shape with the same codec get payloads with identical specs (`payload.spec()`), which is
what an all-gather of packed payloads needs.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from geotrain.errors import GeotrainError


class CodecError(GeotrainError, ValueError):
    """Bad codec name, parameter or payload."""


class CodecTypeError(CodecError, TypeError):
    """The input is not a floating-point tensor (codecs compress float gradients/activations only)."""


class NonFiniteGradientError(GeotrainError, ValueError):
    """The input holds NaN or inf and the codec was not told to pass them through."""


@dataclass(frozen=True)
class BufferSpec:
    """One wire buffer without its data: name, dtype, shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)


@dataclass(frozen=True)
class PayloadSpec:
    """Everything about a payload except its data: enough to unpack its bytes (`unpack_payload`)."""

    codec: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    buffers: tuple[BufferSpec, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Wire bytes of a payload with this spec."""
        return sum(buffer.nbytes for buffer in self.buffers)


@dataclass(frozen=True)
class Payload:
    """What goes on the wire: named contiguous CPU tensors, plus small metadata that is not counted."""

    codec: str
    buffers: dict[str, torch.Tensor]
    shape: tuple[int, ...]
    dtype: torch.dtype
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Wire bytes: the sum of the buffers' sizes."""
        return sum(t.numel() * t.element_size() for t in self.buffers.values())

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def spec(self) -> PayloadSpec:
        """The payload without its data (buffer names, dtypes and shapes in wire order; meta)."""
        buffers = tuple(BufferSpec(name, t.dtype, tuple(t.shape)) for name, t in self.buffers.items())
        return PayloadSpec(self.codec, tuple(self.shape), self.dtype, buffers, dict(self.meta))


class Codec(ABC):
    """One compression scheme. Subclasses set `name` and implement encode/decode/wire_nbytes.

    `summable`: True when payloads of the same spec can be summed element-wise in compressed form
    (so a plain all-reduce works); False when receivers must all-gather payloads and decode each.
    `allow_nonfinite`: False (default) -> NaN/inf input raises NonFiniteGradientError; True -> the
    codec does not check and non-finite values propagate wherever the codec carries them (so the
    receiver's own inf check, e.g. an AMP-style step skip, still sees them). Codecs are stateless
    across calls except for an explicit step counter (`set_step`), used by seeded codecs.
    """

    name: str = ""
    summable: bool = False

    def __init__(self, *, allow_nonfinite: bool = False) -> None:
        self.allow_nonfinite = bool(allow_nonfinite)
        self.step = 0

    @abstractmethod
    def encode(self, tensor: torch.Tensor) -> Payload:
        """Compress `tensor` (any float dtype, any shape, may be empty)."""

    @abstractmethod
    def decode(self, payload: Payload) -> torch.Tensor:
        """Reconstruct a tensor of the payload's shape and dtype."""

    @abstractmethod
    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        """The documented wire size in bytes of a tensor of `shape` (equals encode(x).nbytes)."""

    def params(self) -> dict[str, Any]:
        """Constructor parameters (JSON-able), e.g. for tables and logs."""
        return {"allow_nonfinite": self.allow_nonfinite}

    def set_step(self, step: int) -> None:
        """Set the step counter used by seeded codecs (randk's mask, powersgd's start); workers that
        set the same step before encoding agree on everything random. Harmless for other codecs."""
        if int(step) < 0:
            raise CodecError(f"step must be >= 0, got {step}")
        self.step = int(step)

    def expected_spec(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> PayloadSpec:
        """The spec of encode(x) for any x of this shape and dtype at the current step (to size receive buffers)."""
        return self.encode(torch.zeros(shape, dtype=dtype)).spec()

    def roundtrip(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
        """decode(encode(tensor)) and the wire bytes."""
        payload = self.encode(tensor)
        return self.decode(payload), payload.nbytes

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in self.params().items())
        return f"{type(self).__name__}({args})"

    # -- helpers for subclasses -------------------------------------------------------------
    def _check_input(self, tensor: torch.Tensor) -> torch.Tensor:
        """Validate type; return the tensor contiguous and on CPU. Finiteness is checked by the codec."""
        if not isinstance(tensor, torch.Tensor):
            raise CodecTypeError(f"codec {self.name!r} encodes torch tensors, got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise CodecTypeError(f"codec {self.name!r} encodes floating-point tensors "
                                 f"(float16, bfloat16, float32, float64), got {tensor.dtype}")
        return tensor.detach().cpu().contiguous()

    def _check_payload(self, payload: Payload, *names: str) -> None:
        if payload.codec != self.name:
            raise CodecError(f"codec {self.name!r} cannot decode a {payload.codec!r} payload")
        missing = [name for name in names if name not in payload.buffers]
        if missing:
            raise CodecError(f"{self.name!r} payload lacks buffers {missing} (has {sorted(payload.buffers)})")

    def _raise_if_nonfinite(self, tensor: torch.Tensor, reduced: torch.Tensor | float,
                            wire: torch.Tensor | None = None) -> None:
        """Raise NonFiniteGradientError if `tensor` has NaN/inf, unless allowed.

        `reduced` is a cheap reduction the codec computed anyway (a sum, max|x|, mean|x|): NaN/inf
        in the input make it non-finite, so the exact (slower) element checks run only then. If the
        input is finite but `wire` (what goes on the wire: cast values, scales) is not, the values
        exceed the wire format's range: CodecError. A finite input whose check sum merely
        overflowed passes.
        """
        if self.allow_nonfinite:
            return
        value = reduced if isinstance(reduced, torch.Tensor) else torch.tensor(float(reduced))
        if bool(torch.isfinite(value).all()):
            return
        bad = ~torch.isfinite(tensor)
        if bool(bad.any()):
            count = int(bad.sum())
            raise NonFiniteGradientError(
                f"codec {self.name!r}: input of shape {tuple(tensor.shape)} holds {count} NaN/inf value(s); "
                f"pass allow_nonfinite=True to send them through")
        if wire is not None and not bool(torch.isfinite(wire).all()):
            raise CodecError(f"codec {self.name!r}: finite input of shape {tuple(tensor.shape)} overflows the "
                             f"wire format (max |x| = {float(tensor.abs().max()):.3g}); scale it down first")


def numel_of(shape: tuple[int, ...]) -> int:
    """Number of values of a tensor of `shape` (1 for a scalar, 0 if any dim is 0)."""
    return math.prod(int(dim) for dim in shape)


def extremes(tensor: torch.Tensor) -> torch.Tensor:
    """[min, max] of `tensor` (zeros if empty): non-finite whenever it holds NaN/inf. One vectorised
    pass for every float dtype (a float32 sum of fp16 values is ~20x slower); the probe that
    _raise_if_nonfinite needs."""
    if tensor.numel() == 0:
        return torch.zeros(2)
    low, high = torch.aminmax(tensor.reshape(-1))
    return torch.stack([low, high])


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
