"""`rotated-sign`: a random rotation, then one sign bit per value and one fp32 scale per block.

Each whole block of `block_size` (a power of two) consecutive values of the flattened tensor is rotated by
a randomised Hadamard transform, y = H D x / sqrt(b) (D: random +-1 per value, H: the b x b Sylvester
Hadamard matrix), sent as signs with one scale s per block, and decoded as x' = D H (s signs) / sqrt(b)
(H D / sqrt(b) is orthogonal: its inverse is its transpose). Three ways to pick the signs and s:
- `stochastic=false` (default): sign(y), s = sum(y^2) / sum|y|: the error is orthogonal to the block,
  <x', x> = |x|^2 exactly, its energy about (pi/2 - 1) |x|^2 for Gaussian-like y; a fixed code of the rotated
  values, so what is left of its bias depends on the rotation.
- `stochastic=true` (QSGD-style): s = max|y|, each sign drawn with P(+) = (1 + y/s) / 2: exactly unbiased,
  E[x'] = x, at a larger variance (s^2 - y^2 per rotated value: ~10 |x|^2 at b = 1024).
- `stochastic=true, clip=c`: s = min(max|y|, c rms(y)), values beyond +-s drawn as +-s: unbiased for all but
  the few rotated values past c rms (a small shrink of those), ~3x (c = 2) less variance.

Why rotate: a fixed 1-bit code (sign-block) errs the same way every time it meets the same values, so activation
gradients coded by it pull training off course step after step (bench pipeline: +1.4 nats at 600 steps); after a
fresh rotation the error points somewhere new on every call, and the rotated values are near Gaussian (max|y| a
few rms), which is what keeps a stochastic sign's variance bounded.

The rotation's key (a 64-bit seed for D and the stochastic draws) is drawn from (seed, step, the input's bits):
the same input gives the same payload (bit-reproducible), every different tensor a different rotation; the key
travels as a buffer, so decoding needs no state (it rides a pipeline cut, geotrain.codecs.carrier).

A last, shorter block is coded the same way without the rotation (no padding crosses). Wire bytes:
ceil(n / 8) + 4 ceil(n / b) + 8: sign-block's bytes (1.25 bits a value at b = 128, 1.03 at b = 1024) plus 8
per tensor. `scale_dtype=bf16` sends the scales in bfloat16 (fp32's range, 8 bits of mantissa: a scale off by at
most 2^-9 of itself), 2 bytes each instead of 4: a block of 64 at block 128's bytes. Zeros: an all-zero block decodes to zeros. NaN/inf are refused unless allow_nonfinite (then their
block decodes to NaN).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from geotrain.codecs.base import BufferSpec, Codec, CodecError, Payload, numel_of, parse_count, parse_flag
from geotrain.codecs.dtypes import float_dtype, itemsize
from geotrain.codecs.selection import seeded_generator
from geotrain.codecs.sign import pack_sign_bits, unpack_sign_bits


_SCALE_DTYPES = ("fp32", "bf16")
"""Names scale_dtype takes (geotrain.codecs.dtypes)."""


class RotatedSignCodec(Codec):
    """Randomised Hadamard rotation per block, packed sign bits, one scale per block, the rotation's key."""

    name = "rotated-sign"

    def __init__(self, *, block_size: int = 128, seed: int = 0, stochastic: bool = False, clip: float = 0.0,
                 scale_dtype: str = "fp32", allow_nonfinite: bool = False) -> None:
        super().__init__(allow_nonfinite=allow_nonfinite)
        block = parse_count(block_size, "rotated-sign: block_size", minimum=1)
        if block & (block - 1):
            raise CodecError(f"rotated-sign: block_size must be a power of two, got {block_size!r}")
        self.block_size = block
        self.seed = parse_count(seed, "rotated-sign: seed")
        self.stochastic = parse_flag(stochastic, "rotated-sign: stochastic")
        if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not 0 <= clip < math.inf:
            raise CodecError(f"rotated-sign: clip must be a number >= 0, got {clip!r}")
        if clip and not self.stochastic:
            raise CodecError(f"rotated-sign: clip={clip!r} needs stochastic=true (it caps the stochastic scale)")
        self.clip = float(clip)
        self.scale_dtype = scale_dtype
        self.scale_torch_dtype = float_dtype(scale_dtype, "rotated-sign: scale_dtype", _SCALE_DTYPES)

    def params(self) -> dict[str, Any]:
        more = {"clip": self.clip} if self.clip else {}
        if self.scale_dtype != "fp32":
            more["scale_dtype"] = self.scale_dtype
        return {"block_size": self.block_size, "seed": self.seed, "stochastic": self.stochastic, **more,
                **super().params()}

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        flat = x.reshape(-1).to(torch.float32)
        key = rotation_key(flat, self.seed, self.step)
        n, block = flat.numel(), self.block_size
        whole = n // block * block
        # whole blocks rotated; a shorter last block not (no padding crosses)
        parts = [(0, rotate(flat[:whole].double().reshape(-1, block), key)),
                 (whole, flat[whole:].double().reshape(1, -1))]
        up = torch.rand(n, generator=seeded_generator(key, 1), dtype=torch.float64) if self.stochastic else None
        coded = [_sign_code(rows, None if up is None else up[start:start + rows.numel()].reshape(rows.shape),
                            self.clip) for start, rows in parts if rows.numel()]
        wire = torch.cat([scale for _, scale in coded]).to(self.scale_torch_dtype) if coded \
            else torch.zeros(0, dtype=self.scale_torch_dtype)
        probe = sum(float(rows.abs().sum()) for _, rows in parts) + wire.double().sum()
        self._raise_if_nonfinite(x, probe, wire=wire)
        signed = torch.cat([torch.where(negative, -1.0, 1.0).reshape(-1) for negative, _ in coded]) if coded \
            else torch.zeros(0)
        return Payload(self.name, {"bits": pack_sign_bits(signed.to(torch.float32)), "scales": wire,
                                   "key": torch.tensor([key], dtype=torch.int64)},
                       tuple(tensor.shape), tensor.dtype, {"block_size": self.block_size})

    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        block = self._meta_count(payload, "block_size", self.block_size, minimum=1, maximum=1 << 30)
        if block & (block - 1):
            raise CodecError(f"'rotated-sign' payload meta 'block_size' must be a power of two, got {block}")
        return (BufferSpec("bits", torch.uint8, (-(-payload.numel // 8),)),
                BufferSpec("scales", self.scale_torch_dtype, (-(-payload.numel // block),)),
                BufferSpec("key", torch.int64, (1,)))

    def _decode(self, payload: Payload) -> torch.Tensor:
        block = self._meta_count(payload, "block_size", self.block_size, minimum=1)
        n = payload.numel
        scales = payload.buffers["scales"].to(torch.float64)
        per_value = scales.repeat_interleave(block)[:n]
        values = torch.where(unpack_sign_bits(payload.buffers["bits"], n), -per_value, per_value)
        whole = n // block * block
        head = unrotate(values[:whole].reshape(-1, block), int(payload.buffers["key"][0]))
        out = torch.cat([head.reshape(-1), values[whole:]])
        return out.to(payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        n = numel_of(shape)
        return -(-n // 8) + itemsize(self.scale_torch_dtype) * (-(-n // self.block_size)) + 8


def _sign_code(rows: torch.Tensor, draws: torch.Tensor | None,
               clip: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(negative, scale per row) of float64 `rows`: sign(y) with |y|^2 / |y|_1 (draws None), or signs drawn with
    P(+) = (1 + y / s) / 2, s = max|y| or, with `clip` > 0, min(max|y|, clip x rms(y)) (values beyond s count as
    +-s) (`draws`: uniform [0, 1) per value). NaN stays in the scale."""
    if draws is None:
        norm1 = rows.abs().sum(dim=1)
        return rows < 0, torch.where(norm1 == 0, torch.zeros_like(norm1), (rows * rows).sum(dim=1) / norm1)
    scales = rows.abs().amax(dim=1)
    if clip:
        scales = torch.minimum(scales, clip * rows.pow(2).mean(dim=1).sqrt())
    ratio = torch.where(scales[:, None] == 0, torch.zeros_like(rows), rows / scales[:, None]).clamp(-1.0, 1.0)
    return draws >= (1 + ratio) / 2, scales


def rotation_key(flat: torch.Tensor, seed: int, step: int) -> int:
    """A 63-bit key from (seed, step, the float32 bits of `flat`): equal inputs give equal keys."""
    bits = flat.contiguous().view(torch.int32).to(torch.int64)
    weights = 2 * torch.arange(bits.numel(), dtype=torch.int64) + 1
    digest = int((bits * weights).sum())  # int64 arithmetic wraps: a hash, not a sum
    state = np.random.SeedSequence([seed, step, digest & 0xFFFFFFFFFFFFFFFF]).generate_state(2, np.uint64)
    return int(state[0] >> np.uint64(1))


def rotate(blocks: torch.Tensor, key: int) -> torch.Tensor:
    """H D x / sqrt(b) of each row of `blocks` (rows, b), float64; D's signs drawn from `key`."""
    return hadamard(blocks * _signs(blocks.shape, key)) / math.sqrt(max(1, blocks.shape[1]))


def unrotate(rotated: torch.Tensor, key: int) -> torch.Tensor:
    """The inverse of `rotate`: D H y / sqrt(b)."""
    return hadamard(rotated) / math.sqrt(max(1, rotated.shape[1])) * _signs(rotated.shape, key)


def hadamard(rows: torch.Tensor) -> torch.Tensor:
    """Each row (of a power-of-two length b) times the Sylvester Hadamard matrix (entries +-1, unnormalised),
    by the fast Walsh-Hadamard transform: log2(b) passes of sums and differences."""
    count, b = rows.shape
    out, half = rows, 1
    while half < b:
        pairs = out.reshape(count, b // (2 * half), 2, half)
        out = torch.stack((pairs[:, :, 0] + pairs[:, :, 1], pairs[:, :, 0] - pairs[:, :, 1]), dim=2).reshape(count, b)
        half *= 2
    return out


def _signs(shape: tuple[int, ...] | torch.Size, key: int) -> torch.Tensor:
    """D: +-1.0 (float64) per value, drawn from `key`."""
    draws = torch.randint(0, 2, tuple(shape), generator=torch.Generator().manual_seed(key), dtype=torch.int64)
    return (2 * draws - 1).to(torch.float64)


