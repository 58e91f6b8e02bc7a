"""The codec contract: every gradient/activation codec encodes a tensor into the real wire buffers.

    payload = codec.encode(tensor)      # Payload: the tensors that would cross the network
    restored = codec.decode(payload)    # same shape as the input, float32 (or the input float dtype)
    payload.nbytes                      # wire bytes = sum of the buffers' sizes

Metadata (shape, dtype, numel, parameters) travels beside the buffers and is not counted: both sides
of a DDP bucket or a pipeline cut know the shapes in advance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from geotrain.errors import GeotrainError


class CodecError(GeotrainError, ValueError):
    """Bad codec name, parameter or payload."""


class NonFiniteGradientError(GeotrainError, ValueError):
    """The input holds NaN or inf and the codec was not told to pass them through."""


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
        n = 1
        for dim in self.shape:
            n *= dim
        return n


class Codec(ABC):
    """One compression scheme. Subclasses set `name` and implement encode/decode; they are stateless
    across calls except for what is explicit in their constructor (e.g. a seed)."""

    name: str = ""

    @abstractmethod
    def encode(self, tensor: torch.Tensor) -> Payload:
        """Compress `tensor` (any float dtype, any shape, may be empty)."""

    @abstractmethod
    def decode(self, payload: Payload) -> torch.Tensor:
        """Reconstruct a tensor of the payload's shape and dtype."""

    def roundtrip(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
        """decode(encode(tensor)) and the wire bytes."""
        payload = self.encode(tensor)
        return self.decode(payload), payload.nbytes
