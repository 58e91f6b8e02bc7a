"""Low-bit blockwise codecs for outer gradients: `int4-block`, `fp4-block` (e2m1) and `int2-block`.

A block of `block_size` consecutive values of the flattened tensor (the last block may be shorter) is
sent as one fp32 scale = the block's peak max |x| and one b-bit code per value: the index of the grid
point nearest to x / peak, on a fixed grid of levels in [-1, 1] (ties go to the lower level). Decoding
gives grid[code] * peak, so each value is off by at most half the widest gap of the grid times its
block's peak (plus fp32 rounding):

    codec        bits  grid (x peak)                                  widest gap  error <= peak x
    int4-block   4     k / 7, k = -7..7 (15 levels)                   1/7         1/14
    fp4-block    4     +-{0, .5, 1, 1.5, 2, 3, 4, 6} / 6 (e2m1, 15)   1/3 (4..6)  1/6
    int2-block   2     {-1, -1/3, 1/3, 1} (4 levels, no zero)         2/3         1/3

Codes are packed 8 / bits per byte, least significant bits first (code i of byte j is value
j * 8/bits + i); the unused high bits of the last byte are zero. A code beyond the grid (a 4-bit code
15) is refused by decode.

Wire bytes: ceil(n * bits / 8) + 4 * ceil(n / block_size); with the default block of 128 values
that is 0.531 bytes per value for the 4-bit codecs and 0.281 for int2-block (fp32: 4).

An all-zero block has peak 0 and decodes to (signed) zeros; a block holding NaN/inf has a non-finite
peak and decodes to NaN (only with allow_nonfinite; otherwise encode raises). Values are quantised in
fp32: a finite float64 input beyond fp32's range raises CodecError ("overflows the wire format").
Why blockwise: one large outer-gradient value only coarsens its own block (Streaming DiLoCo sends its
outer gradients in 4-bit floats; SparseLoCo's values in 2 bits, with error feedback).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numba import njit

from geotrain.codecs.base import BufferSpec, Codec, CodecError, Payload, numel_of

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _grid(levels: list[float]) -> torch.Tensor:
    return torch.tensor(sorted(set(levels)), dtype=torch.float32)


GRIDS: dict[str, tuple[int, torch.Tensor]] = {
    "int4": (4, _grid([k / 7 for k in range(-7, 8)])),
    "fp4": (4, _grid([s * v / 6 for v in _E2M1 for s in (-1.0, 1.0)])),
    "int2": (2, _grid([-1.0, -1 / 3, 1 / 3, 1.0])),
}
"""Name -> (bits per code, sorted fp32 levels in [-1, 1]); every grid ends at -1 and 1 exactly."""


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 bytes holding 8 / bits codes each, least significant first (see module doc)."""
    flat = codes.reshape(-1).to(torch.uint8).contiguous().numpy()
    per = 8 // bits
    packed = np.empty(-(-flat.size // per), dtype=np.uint8)
    _pack(flat, bits, packed)
    return torch.from_numpy(packed)


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The first n codes of `packed` (the inverse of pack_codes)."""
    data = packed.reshape(-1).to(torch.uint8).contiguous().numpy()
    if n > data.size * (8 // bits):
        raise CodecError(f"unpack_codes: {data.size} bytes hold {data.size * (8 // bits)} {bits}-bit codes, not {n}")
    codes = np.empty(n, dtype=np.uint8)
    _unpack(data, bits, codes)
    return torch.from_numpy(codes)


@njit(cache=True)
def _pack(codes, bits, packed):  # pragma: no cover - compiled
    per = 8 // bits
    n = codes.size
    for j in range(packed.size):
        byte = 0
        for i in range(per):
            k = j * per + i
            if k < n:
                byte |= (codes[k] << (i * bits)) & 0xFF
        packed[j] = byte


@njit(cache=True)
def _unpack(packed, bits, codes):  # pragma: no cover - compiled
    per = 8 // bits
    mask = (1 << bits) - 1
    n = codes.size
    full = n // per  # bytes whose every code is wanted: no per-code division (3x faster)
    for j in range(full):
        byte = packed[j]
        for i in range(per):
            codes[j * per + i] = (byte >> (i * bits)) & mask
    for k in range(full * per, n):
        codes[k] = (packed[k // per] >> ((k % per) * bits)) & mask


def quantize_blocks(flat: torch.Tensor, block: int, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes, fp32 peaks) of the fp32 vector `flat` in blocks of `block` values on `grid`: code = the
    level nearest to x / peak (an fp32 division; ties to the lower level), 0 where the peak is 0 or not
    finite."""
    values = flat.reshape(-1).to(torch.float32).contiguous().numpy()
    peaks = np.empty(-(-values.size // block), dtype=np.float32)
    codes = np.empty(values.size, dtype=np.uint8)
    levels = grid.to(torch.float32).numpy()
    midpoints = (levels[1:] + levels[:-1]) / np.float32(2)  # fp32, as the levels
    _block_peaks(values, block, peaks)
    gaps = np.diff(levels.astype(np.float64))
    even = np.allclose(gaps, gaps[0], rtol=1e-6, atol=0)  # int4, int2: one guess, one correction
    bounded = np.concatenate([[-np.inf], midpoints, [np.inf]]).astype(np.float32)
    _quantize(values, block, peaks, bounded, np.float32(1.0 / gaps[0] if even else 0.0), codes)
    return torch.from_numpy(codes), torch.from_numpy(peaks)


def dequantize_blocks(codes: torch.Tensor, peaks: torch.Tensor, block: int, grid: torch.Tensor,
                      where: str) -> torch.Tensor:
    """grid[code] * peak of its block, fp32 (NaN where the peak is not finite); CodecError (naming
    `where`) for a code beyond the grid."""
    n = codes.numel()
    if n and int(codes.max()) >= grid.numel():
        raise CodecError(f"{where}: code {int(codes.max())} is beyond the grid's {grid.numel()} levels")
    if peaks.numel() < -(-n // block):
        raise CodecError(f"{where}: {peaks.numel()} block scales for {n} values in blocks of {block}")
    out = np.empty(n, dtype=np.float32)
    _dequantize(codes.reshape(-1).to(torch.uint8).contiguous().numpy(), peaks.to(torch.float32).contiguous().numpy(),
                block, grid.to(torch.float32).numpy(), out)
    return torch.from_numpy(out)


# Compiled per block while it sits in cache (as geotrain.codecs.quantize's int8 kernels). The arithmetic is
# the torch reference's, operation for operation: the peak is max |x| with NaN winning, y = x / peak in
# fp32, code = the number of grid midpoints below y (torch.bucketize's rule: ties to the lower level), a
# value = level * peak in fp32 (tests/unit/codecs/test_codecs_lowbit.py holds them bit for bit).
@njit(cache=True)
def _block_peaks(values, block, peaks):  # pragma: no cover - compiled
    n = values.size
    for b in range(peaks.size):
        start = b * block
        chunk = values[start:min(start + block, n)]
        peak = np.float32(0.0)
        nan = False
        for i in range(chunk.size):
            magnitude = abs(chunk[i])
            nan |= magnitude != magnitude
            peak = max(peak, magnitude)
        peaks[b] = np.float32(np.nan) if nan else peak


@njit(cache=True)
def _quantize(values, block, peaks, bounded, inverse_gap, codes):  # pragma: no cover - compiled
    # code = the number of midpoints below y (`bounded`: -inf, the midpoints, +inf). An evenly spaced grid
    # on [-1, 1] (inverse_gap > 0: 1 / the gap between levels) takes a guess, floor((y + 1) / gap + 1/2),
    # which is the count up to fp32 rounding (off by at most one near a midpoint), and compares y with the
    # two midpoints around it: the same code, branch-free, 4x faster than counting 14 midpoints; other
    # grids count them all
    n = values.size
    top = bounded.size - 2  # the midpoints
    zero_code = 0  # the code of y = 0
    for m in range(1, top + 1):
        zero_code += bounded[m] < np.float32(0.0)
    for b in range(peaks.size):
        start = b * block
        chunk = values[start:min(start + block, n)]
        out = codes[start:start + chunk.size]
        peak = peaks[b]
        if not np.isfinite(peak):
            out[:] = zero_code  # y = 0 (the block decodes to NaN whatever its codes)
            continue
        safe = peak if peak > 0 else np.float32(1.0)
        if inverse_gap > 0:
            for i in range(chunk.size):
                y = chunk[i] / safe
                guess = min(max(int((y + np.float32(1.0)) * inverse_gap + np.float32(0.5)), 0), top)
                out[i] = guess + (bounded[guess + 1] < y) - (not bounded[guess] < y)
        else:
            for i in range(chunk.size):
                y = chunk[i] / safe
                count = 0
                for m in range(1, top + 1):
                    count += bounded[m] < y
                out[i] = count


@njit(cache=True)
def _dequantize(codes, peaks, block, levels, out):  # pragma: no cover - compiled
    n = codes.size
    for b in range(peaks.size):
        start = b * block
        stop = min(start + block, n)
        if start >= n:
            break
        peak = peaks[b]
        if not np.isfinite(peak):
            out[start:stop] = np.nan
            continue
        for i in range(start, stop):
            out[i] = levels[codes[i]] * peak


class LowBitBlockCodec(Codec):
    """b-bit codes on a fixed grid with one fp32 peak per block of `block_size` values (module doc)."""

    grid_name = ""

    def __init__(self, *, block_size: int = 128, allow_nonfinite: bool = False) -> None:
        super().__init__(allow_nonfinite=allow_nonfinite)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise CodecError(f"{self.name}: block_size must be an integer >= 1, got {block_size!r}")
        self.block_size = block_size
        self.bits, self.grid = GRIDS[self.grid_name]

    def params(self) -> dict[str, Any]:
        return {"block_size": self.block_size, **super().params()}

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        flat = x.reshape(-1).to(torch.float32)
        codes, peaks = quantize_blocks(flat, self.block_size, self.grid)
        self._raise_if_nonfinite(x, peaks, wire=peaks)
        return Payload(self.name, {"codes": pack_codes(codes, self.bits), "scales": peaks}, tuple(tensor.shape),
                       tensor.dtype, {"block_size": self.block_size})

    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        block = self._meta_count(payload, "block_size", self.block_size, minimum=1)
        n = payload.numel
        return (BufferSpec("codes", torch.uint8, (-(-n * self.bits // 8),)),
                BufferSpec("scales", torch.float32, (-(-n // block),)))

    def _decode(self, payload: Payload) -> torch.Tensor:
        block = self._meta_count(payload, "block_size", self.block_size, minimum=1)
        codes = unpack_codes(payload.buffers["codes"], self.bits, payload.numel)
        values = dequantize_blocks(codes, payload.buffers["scales"], block, self.grid, f"{self.name!r} payload")
        return values.to(payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        n = numel_of(shape)
        return -(-n * self.bits // 8) + 4 * (-(-n // self.block_size))


class Int4BlockCodec(LowBitBlockCodec):
    """4-bit integer levels k/7 of the block peak (0.5 + 4/block_size bytes per value)."""

    name = "int4-block"
    grid_name = "int4"


class Fp4BlockCodec(LowBitBlockCodec):
    """4-bit e2m1 floats (+-0, .5, 1, 1.5, 2, 3, 4, 6) scaled so 6 is the block peak."""

    name = "fp4-block"
    grid_name = "fp4"


class Int2BlockCodec(LowBitBlockCodec):
    """2-bit levels {-1, -1/3, 1/3, 1} of the block peak (0.25 + 4/block_size bytes per value)."""

    name = "int2-block"
    grid_name = "int2"
