"""`log-block`: a sign and a log-spaced magnitude per value, for tensors whose values span many decades.

A block of `block_size` consecutive values of the flattened tensor (the last block may be shorter) is
sent as two fp32 numbers, lo and hi = the natural log of the smallest and the largest non-zero |x| in
the block, and one `bits`-bit code per value: the high bit is the sign, the other bits k (0..K, K =
2^(bits-1) - 1) the magnitude: k = 0 is exactly zero, k >= 1 the level

    |x| = exp(lo + (k - 1) / (K - 1) x (hi - lo))          (K levels from exp(lo) to exp(hi))

nearest to log |x| (ties go to the lower level). So each non-zero value is off by a factor of at most
exp((hi - lo) / (2 (K - 1))) (plus fp32 rounding): relative, whatever its size. A blockwise int8 or int4
code is off by a fraction of the block's largest value, which turns the small values of a block into
zeros. That is what Adam's second moment cannot take (it divides by the square root: bench wan's tiny
GPT spans ten decades of exp_avg_sq, and int8-block sent it to ruin; docs/history/diloco.md, "Moment sync").

    bits  magnitude levels  wire bytes per value (block 128)
    4     7                 0.5625
    8     127               1.0625

A block without non-zero values has lo = hi = 0 and decodes to zeros. NaN/inf: refused (NonFiniteGradientError)
unless allow_nonfinite, and then the block decodes to NaN. Codes are packed as geotrain.codecs.lowbit packs them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numba import njit

from geotrain.codecs.base import BufferSpec, Codec, CodecError, Payload, numel_of
from geotrain.codecs.lowbit import pack_codes, unpack_codes

LOG_BITS = (4, 8)
_FP32_MAX = float(np.finfo(np.float32).max)  # decoded magnitudes stay within fp32's finite, non-zero range
_FP32_SMALLEST = float(np.finfo(np.float32).smallest_subnormal)


# Compiled (numba), per block: pass 1 the smallest and largest non-zero |x| (two logs per block), then each
# value's level by counting the K - 1 thresholds between levels (geometric midpoints, float64) below |x|:
# the level nearest in the log domain, ties to the lower one, without a log per value. Decoding looks the
# level up in a table of the block's K magnitudes (K exps per block).
@njit(cache=True)
def _encode(values, block, levels, bits, bounds, codes):  # pragma: no cover - compiled
    n = values.size
    thresholds = np.empty(max(levels - 1, 1), dtype=np.float64)
    sign_bit = np.uint8(1 << (bits - 1))
    for b in range(bounds.size // 2):
        start = b * block
        stop = min(start + block, n)
        smallest = np.inf
        largest = 0.0
        finite = True
        for i in range(start, stop):
            magnitude = abs(np.float64(values[i]))
            if not np.isfinite(magnitude):
                finite = False
            elif magnitude > 0.0:
                smallest = min(smallest, magnitude)
                largest = max(largest, magnitude)
        if not finite:
            bounds[2 * b] = np.nan
            bounds[2 * b + 1] = np.nan
            codes[start:stop] = 0
            continue
        if largest == 0.0:
            bounds[2 * b] = 0.0
            bounds[2 * b + 1] = 0.0
            codes[start:stop] = 0
            continue
        lo = np.float32(np.log(smallest))
        hi = np.float32(np.log(largest))
        bounds[2 * b] = lo
        bounds[2 * b + 1] = hi
        step = (np.float64(hi) - np.float64(lo)) / max(levels - 1, 1)
        for j in range(levels - 1):
            thresholds[j] = np.exp(np.float64(lo) + (j + 0.5) * step)
        for i in range(start, stop):
            value = np.float64(values[i])
            magnitude = abs(value)
            if magnitude == 0.0:
                codes[i] = 0
                continue
            k = 1
            for j in range(levels - 1):
                k += thresholds[j] < magnitude
            codes[i] = np.uint8(k) | (sign_bit if value < 0.0 else np.uint8(0))


@njit(cache=True)
def _decode(codes, bounds, block, levels, bits, out):  # pragma: no cover - compiled
    n = codes.size
    table = np.empty(levels + 1, dtype=np.float32)
    table[0] = 0.0
    for b in range(bounds.size // 2):
        start = b * block
        stop = min(start + block, n)
        if start >= n:
            break
        lo = np.float64(bounds[2 * b])
        hi = np.float64(bounds[2 * b + 1])
        if not (np.isfinite(lo) and np.isfinite(hi)):
            out[start:stop] = np.nan
            continue
        step = (hi - lo) / max(levels - 1, 1)
        for j in range(levels):
            # lo and hi are logs rounded to fp32: at fp32's edges exp() can leave its range; clamp to it,
            # so a finite non-zero value never decodes to inf or to zero
            table[j + 1] = np.float32(min(max(np.exp(lo + j * step), _FP32_SMALLEST), _FP32_MAX))
        for i in range(start, stop):
            code = codes[i]
            magnitude = table[code & levels]
            out[i] = -magnitude if (code >> (bits - 1)) & 1 else magnitude


class LogBlockCodec(Codec):
    """Sign + log-spaced magnitude codes, two fp32 log bounds per block (module doc)."""

    name = "log-block"

    def __init__(self, *, bits: int = 4, block_size: int = 128, allow_nonfinite: bool = False) -> None:
        super().__init__(allow_nonfinite=allow_nonfinite)
        if isinstance(bits, bool) or bits not in LOG_BITS:
            raise CodecError(f"{self.name}: bits must be one of {LOG_BITS}, got {bits!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise CodecError(f"{self.name}: block_size must be an integer >= 1, got {block_size!r}")
        self.bits = bits
        self.block_size = block_size
        self.levels = (1 << (bits - 1)) - 1  # K non-zero magnitudes

    def params(self) -> dict[str, Any]:
        return {"bits": self.bits, "block_size": self.block_size, **super().params()}

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        values = x.reshape(-1).to(torch.float32).contiguous().numpy()
        n, block = values.size, self.block_size
        bounds = np.empty(2 * (-(-n // block)), dtype=np.float32)
        codes = np.empty(n, dtype=np.uint8)
        _encode(values, block, self.levels, self.bits, bounds, codes)
        wire = torch.from_numpy(bounds)
        self._raise_if_nonfinite(x, wire.sum(), wire=wire)  # a block holding NaN/inf has NaN bounds
        return Payload(self.name, {"codes": pack_codes(torch.from_numpy(codes), self.bits), "bounds": wire},
                       tuple(tensor.shape), tensor.dtype, {"block_size": block, "bits": self.bits})

    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        block = self._meta_count(payload, "block_size", self.block_size, minimum=1)
        bits = self._meta_count(payload, "bits", self.bits)
        if bits != self.bits:
            raise CodecError(f"{self.name!r} payload of {bits} bits, this codec decodes {self.bits}")
        n = payload.numel
        return (BufferSpec("codes", torch.uint8, (-(-n * self.bits // 8),)),
                BufferSpec("bounds", torch.float32, (2 * (-(-n // block)),)))

    def _decode(self, payload: Payload) -> torch.Tensor:
        block = self._meta_count(payload, "block_size", self.block_size, minimum=1)
        codes = unpack_codes(payload.buffers["codes"], self.bits, payload.numel).numpy()
        out = np.empty(payload.numel, dtype=np.float32)
        _decode(codes, payload.buffers["bounds"].to(torch.float32).contiguous().numpy(), block, self.levels,
                self.bits, out)
        return torch.from_numpy(out).to(payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        n = numel_of(shape)
        return -(-n * self.bits // 8) + 8 * (-(-n // self.block_size))
