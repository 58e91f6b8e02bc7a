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

import torch

from geotrain.codecs.base import Codec, CodecError, Payload, numel_of

_LEVELS = 127.0
_FLOAT32_MAX = torch.finfo(torch.float32).max


class Int8Codec(Codec):
    """int8 codes with one fp32 scale per tensor (1 + 4/n bytes per value)."""

    name = "int8"

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        flat = x.reshape(-1).to(torch.float32)
        if flat.numel():
            low, high = torch.aminmax(flat)
            peak = torch.maximum(high, -low).reshape(1)
        else:
            peak = torch.zeros(1)
        codes, scales = _quantize(flat, peak, None, self, x)
        return Payload(self.name, {"codes": codes, "scales": scales}, tuple(tensor.shape), tensor.dtype)

    def decode(self, payload: Payload) -> torch.Tensor:
        self._check_payload(payload, "codes", "scales")
        out = payload.buffers["codes"].to(torch.float32)
        out.mul_(payload.buffers["scales"])
        return out.to(payload.dtype).reshape(payload.shape)

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
        flat = x.reshape(-1).to(torch.float32)
        full, tail = _split_blocks(flat, self.block_size)
        peaks = []
        if full.numel():
            low, high = torch.aminmax(full, dim=1)
            peaks.append(torch.maximum(high, -low))
        if tail.numel():
            low, high = torch.aminmax(tail)
            peaks.append(torch.maximum(high, -low).reshape(1))
        peak = torch.cat(peaks) if peaks else torch.zeros(0)
        codes, scales = _quantize(flat, peak, self.block_size, self, x)
        return Payload(self.name, {"codes": codes, "scales": scales}, tuple(tensor.shape), tensor.dtype,
                       {"block_size": self.block_size})

    def decode(self, payload: Payload) -> torch.Tensor:
        self._check_payload(payload, "codes", "scales")
        block = int(payload.meta.get("block_size", self.block_size))
        scales = payload.buffers["scales"]
        out = payload.buffers["codes"].to(torch.float32)
        full, tail = _split_blocks(out, block)
        if full.numel():
            full.mul_(scales[:full.shape[0], None])
        if tail.numel():
            tail.mul_(scales[-1])
        return out.to(payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        n = numel_of(shape)
        return n + 4 * (-(-n // self.block_size))


def _quantize(flat: torch.Tensor, peak: torch.Tensor, block: int | None, codec: Codec,
              original: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes of fp32 `flat` and fp32 scales, given each group's max |x| (`peak`): one group
    when `block` is None, else one per block of `block` values."""
    peak = peak.abs()  # max(-0.0, 0.0) may be -0.0; scales are never negative zeros
    scales = peak / _LEVELS
    codec._raise_if_nonfinite(original, peak, wire=scales)
    # 1/scale, with 0 for all-zero groups; capped where a subnormal peak would make it overflow.
    inverse = torch.where(peak > 0, _LEVELS / peak, torch.zeros_like(peak)).clamp_(max=_FLOAT32_MAX)
    scaled = torch.empty_like(flat)
    if block is None:
        torch.mul(flat, inverse, out=scaled)
    else:
        full, tail = _split_blocks(flat, block)
        scaled_full, scaled_tail = _split_blocks(scaled, block)
        if full.numel():
            torch.mul(full, inverse[:full.shape[0], None], out=scaled_full)
        if tail.numel():
            torch.mul(tail, inverse[-1], out=scaled_tail)
    # |scaled| <= 127 * (1 + 2 eps) < 127.5, so rounding stays in -127..127: no clamp needed.
    codes = scaled.round_().to(torch.int8)
    return codes, scales.to(torch.float32).contiguous()


def _split_blocks(flat: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views: the full blocks as (n // block, block) and the shorter tail block (maybe empty)."""
    n_full = flat.numel() // block
    return flat[:n_full * block].view(n_full, block), flat[n_full * block:]

