"""Byte-exact serialisation of payloads, for sending them through torch.distributed.

    data = pack_payload(payload)              # 1-D uint8 tensor, len(data) == payload.nbytes
    same = unpack_payload(data, payload.spec())

Buffers are laid out back to back in the payload's buffer order, each in its native byte order,
with no header and no padding: the spec (which both sides know or compute) says how to cut them.
"""

from __future__ import annotations

import torch

from geotrain.codecs.base import CodecError, Payload, PayloadSpec


def payload_spec(payload: Payload) -> PayloadSpec:
    """Everything about `payload` except its data."""
    return payload.spec()


def pack_payload(payload: Payload) -> torch.Tensor:
    """The payload's buffers as one 1-D uint8 tensor of exactly `payload.nbytes` bytes."""
    pieces = [_as_bytes(buffer) for buffer in payload.buffers.values()]
    if not pieces:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat(pieces)


def unpack_payload(data: torch.Tensor, spec: PayloadSpec) -> Payload:
    """Rebuild a payload from `data` (1-D uint8, as pack_payload made it) and its spec; bit-exact."""
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise CodecError(f"packed payload must be a 1-D uint8 tensor, got {data.dtype} of shape {tuple(data.shape)}")
    if data.numel() != spec.nbytes:
        raise CodecError(f"packed {spec.codec!r} payload has {data.numel()} bytes, its spec says {spec.nbytes}")
    data = data.detach().cpu()
    buffers: dict[str, torch.Tensor] = {}
    offset = 0
    for buffer in spec.buffers:
        # clone: a slice at an unaligned offset cannot be viewed as a wider dtype in place.
        chunk = data[offset:offset + buffer.nbytes].clone()
        buffers[buffer.name] = chunk.view(buffer.dtype).reshape(buffer.shape)
        offset += buffer.nbytes
    return Payload(spec.codec, buffers, tuple(spec.shape), spec.dtype, dict(spec.meta))


def _as_bytes(buffer: torch.Tensor) -> torch.Tensor:
    if buffer.numel() == 0:  # empty tensors may carry stride 0, which view(uint8) refuses
        return torch.empty(0, dtype=torch.uint8)
    flat = buffer.detach().cpu().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    return flat.view(torch.uint8)
