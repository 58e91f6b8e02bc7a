"""Linear 8-bit quantisation: `int8` (one scale per tensor, as the seed) and `int8-block`.

A group of values (the whole tensor, or a block of `block_size` consecutive values of the flattened
tensor; the last block may be shorter) is sent as int8 codes q = round(x / scale) in -127..127 plus
one fp32 scale = max|x| / 127 per group. Decoding gives q * scale, so each value is off by at most
half a quantisation step, scale / 2, of its own group (plus fp32 rounding; groups whose max |x| is
below ~4e-37 lose precision to float underflow, an absolute error below that max). An all-zero group
has scale 0 and decodes to zeros (no division by zero).

Wire bytes: int8 = n + 4; int8-block = n + 4 * ceil(n / block_size).

Why a block of 256 by default: 4 bytes of scale per 256 values cost 1.6 % over 1 byte per value,
while a block is small enough that one large gradient only coarsens its own 255 neighbours instead
of the whole tensor (the seed's observation: with one scale per tensor most small gradients round
to zero). Blockwise 8-bit schemes in practice use blocks of 64..2048 values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numba import njit

from geotrain.codecs.base import BufferSpec, Codec, CodecError, Payload, numel_of

_FLOAT32_MAX = np.float32(np.finfo(np.float32).max)


class Int8Codec(Codec):
    """int8 codes with one fp32 scale per tensor (1 + 4/n bytes per value)."""

    name = "int8"

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        codes, scales = quantize(self, x, block=None)
        return Payload(self.name, {"codes": codes, "scales": scales}, tuple(tensor.shape), tensor.dtype)

    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        return _int8_buffers(payload.numel, 1)

    def _decode(self, payload: Payload) -> torch.Tensor:
        return dequantize(payload, block=None)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        return numel_of(shape) + 4


class Int8BlockCodec(Codec):
    """int8 codes with one fp32 scale per block of `block_size` values (1 + 4/block_size bytes per value)."""

    name = "int8-block"

    def __init__(self, *, block_size: int = 256, allow_nonfinite: bool = False) -> None:
        super().__init__(allow_nonfinite=allow_nonfinite)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise CodecError(f"int8-block: block_size must be an integer >= 1, got {block_size!r}")
        self.block_size = block_size

    def params(self) -> dict[str, Any]:
        return {"block_size": self.block_size, **super().params()}

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        codes, scales = quantize(self, x, block=self.block_size)
        return Payload(self.name, {"codes": codes, "scales": scales}, tuple(tensor.shape), tensor.dtype,
                       {"block_size": self.block_size})

    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        block = self._meta_count(payload, "block_size", self.block_size, minimum=1)
        return _int8_buffers(payload.numel, -(-payload.numel // block))

    def _decode(self, payload: Payload) -> torch.Tensor:
        return dequantize(payload, block=self._meta_count(payload, "block_size", self.block_size, minimum=1))

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        n = numel_of(shape)
        return n + 4 * (-(-n // self.block_size))


def _int8_buffers(numel: int, groups: int) -> tuple[BufferSpec, ...]:
    """The wire buffers of n values in `groups` groups: int8 codes and one fp32 scale per group."""
    return BufferSpec("codes", torch.int8, (numel,)), BufferSpec("scales", torch.float32, (groups,))


def quantize(codec: Codec, x: torch.Tensor, block: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes and fp32 scales of `x`: one group when `block` is None, else one per `block` values.

    Raises (unless the codec allows non-finite input) when a scale is NaN/inf.
    """
    flat = x.reshape(-1).to(torch.float32).numpy()
    n = flat.size
    group = max(n, 1) if block is None else block
    codes = np.empty(n, dtype=np.int8)
    scales = np.empty(max(1, -(-n // group)) if block is None else -(-n // group), dtype=np.float32)
    _quantize_blocks(flat, group, codes, scales)
    scales_t = torch.from_numpy(scales)
    codec._raise_if_nonfinite(x, scales_t, wire=scales_t)
    return torch.from_numpy(codes), scales_t


def dequantize(payload: Payload, block: int | None) -> torch.Tensor:
    """codes * scale of their group, as the payload's dtype and shape."""
    codes = payload.buffers["codes"].contiguous().numpy()
    out = np.empty(codes.size, dtype=np.float32)
    group = max(codes.size, 1) if block is None else block
    _dequantize_blocks(codes, payload.buffers["scales"].contiguous().numpy(), group, out)
    return torch.from_numpy(out).to(payload.dtype).reshape(payload.shape)


# One pass per block while it sits in cache: the peak, then the codes. The arithmetic is the plain
# float32 sequence scale = peak / 127, inverse = min(127 / peak, FLT_MAX), code = rint(x * inverse),
# the same operations a per-block torch reference performs (tested bit for bit). The peak is the max
# of the values' bit patterns without sign bit: for floats >= 0 that order is the float order, NaN
# patterns sort above inf (so NaN and inf propagate), and integer max vectorises where float max does
# not. Loops run over per-block slices from 0, which LLVM vectorises (start..stop loops it did not).
@njit(cache=True)
def _quantize_blocks(flat, block, codes, scales):  # pragma: no cover - compiled
    n = flat.size
    bits = flat.view(np.int32)
    levels = np.float32(127.0)
    scratch = np.zeros(1, np.int32)
    scratch_float = scratch.view(np.float32)
    for b in range(scales.size):
        start = b * block
        stop = min(start + block, n)
        block_bits = bits[start:stop]
        peak_bits = 0
        for i in range(block_bits.size):
            peak_bits = max(peak_bits, block_bits[i] & 0x7FFFFFFF)
        scratch[0] = peak_bits
        peak = scratch_float[0]
        scales[b] = peak / levels
        block_codes = codes[start:stop]
        if not np.isfinite(peak):
            block_codes[:] = 0  # the group decodes to NaN (0 * NaN or 0 * inf)
            continue
        inverse = min(levels / peak, _FLOAT32_MAX) if peak > 0 else np.float32(0.0)
        values = flat[start:stop]
        for i in range(values.size):
            block_codes[i] = np.int8(np.rint(values[i] * inverse))


@njit(cache=True)
def _dequantize_blocks(codes, scales, block, out):  # pragma: no cover - compiled
    n = codes.size
    for b in range(scales.size):
        scale = scales[b]
        start = b * block
        stop = min(start + block, n)
        block_codes = codes[start:stop]
        values = out[start:stop]
        if not np.isfinite(scale):
            for i in range(block_codes.size):
                values[i] = np.float32(block_codes[i]) * scale  # NaN/inf groups stay non-finite
            continue
        # 127 * (peak / 127) may round above FLT_MAX when the peak is near it: clamp to the peak's range.
        for i in range(block_codes.size):
            values[i] = max(min(np.float32(block_codes[i]) * scale, _FLOAT32_MAX), -_FLOAT32_MAX)
