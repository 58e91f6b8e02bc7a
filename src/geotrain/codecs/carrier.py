"""Packed payloads carried in float32 tensors: how a quantising codec crosses a pipeline cut.

torch.distributed.pipelining sends the float tensors a stage outputs (and their gradients back). A
codec whose wire form is not a float tensor (int8-block, int4-block, sign...) still crosses a cut when
its packed bytes ride in one: row b of the carrier holds `pack_payload(codec.encode(x[b]))` (one
payload per sample, so the carrier keeps the batch dimension torch's schedules and geotrain's
evaluation resize), padded with zero bytes to a multiple of 4 and viewed as float32. The carrier is
only copied, never computed with, so every bit survives (NaN patterns included); the receiver views
it back as bytes and decodes. Wire bytes per sample: `codec.wire_nbytes(sample shape)` rounded up to
a multiple of 4.

A codec may ride only when its payload's layout depends on the shape alone (`CARRIED_CODECS`): both
sides derive the payload spec from the sample shape and nothing travels but the bytes. topk-lowbit
rides: k positions per chunk of a fixed chunk size, so its buffers' sizes are the shape's (the
positions themselves travel as bytes); so does powersgd (a sample's [tokens, hidden] matrix as rank-r
factors P, Q; its only state, the step that seeds Q0, is never advanced on a cut, and decoding needs
none); so do rotated-sign and rotated-ternary (the rotation's key is drawn from the input and travels as an
8-byte buffer). Plain topk/randk are left out (their fp32 or fp16 values make them no cheaper than int8-block).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from geotrain.codecs.base import Codec, PayloadSpec
from geotrain.codecs.wire import pack_payload, unpack_payload

CARRIED_CODECS = ("int8", "int8-block", "int4-block", "fp4-block", "int2-block", "log-block", "sign", "sign-block",
                  "rotated-sign", "rotated-ternary", "topk-lowbit", "powersgd")
"""Codecs whose payload layout is a function of the shape (and parameters) alone: the activation codecs
a float32 carrier takes across a pipeline cut."""

_CARRIER_DTYPE = torch.float32


def carrier_numel(codec: Codec, sample_shape: Sequence[int]) -> int:
    """float32 values per sample that carry `codec`'s payload of one `sample_shape` tensor (bytes / 4, up)."""
    return -(-codec.wire_nbytes(tuple(sample_shape)) // 4)


def cut_bytes_per_value(codec: Codec, sample_shape: Sequence[int], trained_bytes: float) -> float:
    """Wire bytes per activation value of one `sample_shape` ([tokens, hidden]) sample on a cut, for cost models:
    the codec's own size on that shape (a low-rank codec's factors are priced by the sample's matrix, not by
    a weight's), never more than the `trained_bytes`-wide values themselves."""
    shape = tuple(int(n) for n in sample_shape)
    return min(float(trained_bytes), codec.wire_nbytes(shape) / max(1, math.prod(shape)))


def encode_to_carrier(codec: Codec, tensor: torch.Tensor) -> torch.Tensor:
    """(B, carrier_numel) float32 on `tensor`'s device: row b carries codec.encode(tensor[b]) bit for bit."""
    rows = tensor.shape[0]
    width = carrier_numel(codec, tensor.shape[1:])
    data = torch.zeros(rows, width * 4, dtype=torch.uint8)
    for b in range(rows):
        packed = pack_payload(codec.encode(tensor[b].float()))
        data[b, :packed.numel()] = packed
    return data.view(_CARRIER_DTYPE).to(tensor.device)


def decode_from_carrier(codec: Codec, carrier: torch.Tensor, spec: PayloadSpec) -> torch.Tensor:
    """(B, *spec.shape) float32 on `carrier`'s device: the inverse of encode_to_carrier; `spec`: one
    sample's payload spec (`carried_spec`)."""
    data = carrier.detach().to("cpu", copy=False).contiguous().view(torch.uint8)
    rows = [codec.decode(unpack_payload(data[b, :spec.nbytes], spec)) for b in range(carrier.shape[0])]
    out = torch.stack(rows) if rows else torch.empty((0, *spec.shape), dtype=torch.float32)
    return out.to(carrier.device)


def carried_spec(codec: Codec, sample_shape: Sequence[int]) -> PayloadSpec:
    """The payload spec of one float32 sample of `sample_shape` (both sides of a cut derive it)."""
    return codec.expected_spec(tuple(int(n) for n in sample_shape), torch.float32)
