"""Byte-exact serialisation of payloads, for sending them through torch.distributed.

    data = pack_payload(payload)              # 1-D uint8 tensor, len(data) == payload.nbytes
    same = unpack_payload(data, payload.spec())

Buffers are laid out back to back in the payload's buffer order, each in its native byte order,
with no header and no padding: the spec (which both sides know or compute) says how to cut them.
"""

from __future__ import annotations

import torch

from geotrain.codecs.base import BufferSpec, CodecError, Payload, PayloadSpec, checked_shape


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
    """Rebuild a payload from `data` (1-D uint8, as pack_payload made it) and its spec; bit-exact.

    A malformed spec (buffer shapes that are not non-negative ints, repeated names, non-dtypes) or
    data of the wrong type or length raises CodecError; decode then checks the payload itself."""
    _check_spec(spec)
    if not isinstance(data, torch.Tensor):
        raise CodecError(f"packed payload must be a 1-D uint8 tensor, got {type(data).__name__}")
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


def _check_spec(spec: PayloadSpec) -> None:
    if not isinstance(spec, PayloadSpec) or not isinstance(spec.buffers, tuple) or not isinstance(spec.meta, dict):
        raise CodecError(f"unpack_payload needs a PayloadSpec with a tuple of buffers and a meta dict, "
                         f"got {str(spec)[:80]}")
    checked_shape(spec.shape, f"{spec.codec!r} payload spec shape")
    names = set()
    for buffer in spec.buffers:
        if not isinstance(buffer, BufferSpec) or not isinstance(buffer.name, str) or buffer.name in names \
                or not isinstance(buffer.dtype, torch.dtype):
            raise CodecError(f"{spec.codec!r} payload spec: buffers must be BufferSpecs with distinct names "
                             f"and torch dtypes, got {str(buffer)[:80]}")
        checked_shape(buffer.shape, f"{spec.codec!r} payload spec: buffer {buffer.name!r} shape")
        names.add(buffer.name)


def _as_bytes(buffer: torch.Tensor) -> torch.Tensor:
    if buffer.numel() == 0:  # empty tensors may carry stride 0, which view(uint8) refuses
        return torch.empty(0, dtype=torch.uint8)
    flat = buffer.detach().cpu().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    return flat.view(torch.uint8)
