"""`rotated-ternary`: rotated-sign's random rotation, then one trit ({-s, 0, +s}) per value, one scale per block.

Each whole block of `block_size` (a power of two) values is rotated as rotated-sign rotates it
(geotrain.codecs.rotsign: y = H D x / sqrt(b), the key drawn from the input and sent with the payload); a shorter
last block is coded unrotated. A block keeps the signs t of its k largest |y| and zeroes the rest, k = argmax
(sum of the k largest |y|)^2 / k (the ternary code whose least-squares fit errs least), and sends rotated-sign's
scale s = |y|^2 / <y, t>: the projection on the input is exact, <x', x> = |x|^2, and what is left is orthogonal
noise, about 0.23 |x|^2 for Gaussian-like y against rotated-sign's 0.57 (e / (1 - e) |x|^2 for a least-squares
error e). Deterministic: a fresh rotation per tensor is what varies the error (rotated-sign's deterministic code
trained better than its stochastic one on bench pipeline).

Trits travel packed 5 to a byte (3^5 = 243 <= 256: 1.6 bits a value). Wire bytes: ceil(n / 5) + 4 ceil(n / b)
+ 8 (2 per scale with `scale_dtype=bf16`; the 8-byte key). Zeros decode to zeros; NaN/inf are refused unless
allow_nonfinite (then their block decodes to NaN).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from geotrain.codecs.base import BufferSpec, Codec, CodecError, Payload, numel_of, parse_count
from geotrain.codecs.dtypes import float_dtype, itemsize
from geotrain.codecs.rotsign import rotate, rotation_key, unrotate

_SCALE_DTYPES = ("fp32", "bf16")
"""Names scale_dtype takes (geotrain.codecs.dtypes)."""

_TRIT_WEIGHTS = (1, 3, 9, 27, 81)
"""Place values of the 5 trits in a byte, the first least significant."""


class RotatedTernaryCodec(Codec):
    """Randomised Hadamard rotation per block, the best ternary code of each block, one scale per block."""

    name = "rotated-ternary"

    def __init__(self, *, block_size: int = 128, seed: int = 0, scale_dtype: str = "fp32",
                 allow_nonfinite: bool = False) -> None:
        super().__init__(allow_nonfinite=allow_nonfinite)
        block = parse_count(block_size, "rotated-ternary: block_size", minimum=1)
        if block & (block - 1):
            raise CodecError(f"rotated-ternary: block_size must be a power of two, got {block_size!r}")
        self.block_size = block
        self.seed = parse_count(seed, "rotated-ternary: seed")
        self.scale_dtype = scale_dtype
        self.scale_torch_dtype = float_dtype(scale_dtype, "rotated-ternary: scale_dtype", _SCALE_DTYPES)

    def params(self) -> dict[str, Any]:
        more = {"scale_dtype": self.scale_dtype} if self.scale_dtype != "fp32" else {}
        return {"block_size": self.block_size, "seed": self.seed, **more, **super().params()}

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        flat = x.reshape(-1).to(torch.float32)
        key = rotation_key(flat, self.seed, self.step)
        n, block = flat.numel(), self.block_size
        whole = n // block * block
        rows = [rotate(flat[:whole].double().reshape(-1, block), key), flat[whole:].double().reshape(1, -1)]
        coded = [_code(part) for part in rows if part.numel()]
        trits = torch.cat([t.reshape(-1) for t, _ in coded]) if coded else torch.zeros(0, dtype=torch.int64)
        scales = torch.cat([s for _, s in coded]) if coded else torch.zeros(0, dtype=torch.float64)
        wire = scales.to(self.scale_torch_dtype)
        probe = sum(float(part.abs().sum()) for part in rows) + wire.double().sum()
        self._raise_if_nonfinite(x, probe, wire=wire)
        return Payload(self.name, {"trits": pack_trits(trits + 1), "scales": wire,
                                   "key": torch.tensor([key], dtype=torch.int64)},
                       tuple(tensor.shape), tensor.dtype, {"block_size": self.block_size})

    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        block = self._meta_count(payload, "block_size", self.block_size, minimum=1, maximum=1 << 30)
        if block & (block - 1):
            raise CodecError(f"'rotated-ternary' payload meta 'block_size' must be a power of two, got {block}")
        return (BufferSpec("trits", torch.uint8, (-(-payload.numel // 5),)),
                BufferSpec("scales", self.scale_torch_dtype, (-(-payload.numel // block),)),
                BufferSpec("key", torch.int64, (1,)))

    def _decode(self, payload: Payload) -> torch.Tensor:
        block = self._meta_count(payload, "block_size", self.block_size, minimum=1)
        n = payload.numel
        whole = n // block * block
        unit = unpack_trits(payload.buffers["trits"], n).to(torch.float64) - 1
        values = unit * payload.buffers["scales"].to(torch.float64).repeat_interleave(block)[:n]
        head = unrotate(values[:whole].reshape(-1, block), int(payload.buffers["key"][0]))
        return torch.cat([head.reshape(-1), values[whole:]]).to(payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        n = numel_of(shape)
        return -(-n // 5) + itemsize(self.scale_torch_dtype) * (-(-n // self.block_size)) + 8


def _code(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(trits in {-1, 0, 1} (int64), scale per row) of float64 `rows` (rows, b); a row with NaN/inf gets a NaN
    scale (its values code as zeros)."""
    finite = torch.isfinite(rows).all(dim=1)
    y = torch.where(torch.isfinite(rows), rows, torch.zeros_like(rows))
    trits = best_ternary(y)
    along = (y * trits).sum(dim=1)
    scale = torch.where(along == 0, torch.zeros_like(along), (y * y).sum(dim=1) / along)
    return trits, torch.where(finite, scale, torch.full_like(scale, math.nan))


def best_ternary(y: torch.Tensor) -> torch.Tensor:
    """Trits in {-1, 0, 1} (int64) nearest each row of float64 `y` in direction: the signs of the k largest |y|,
    k = argmax (sum of the k largest)^2 / k (the k whose least-squares fit s t errs least)."""
    magnitude, order = y.abs().sort(dim=1, descending=True)
    total = magnitude.cumsum(dim=1)
    count = torch.arange(1, y.shape[1] + 1, dtype=torch.float64)
    k = (total * total / count).argmax(dim=1)
    kept = torch.zeros_like(y, dtype=torch.bool).scatter(1, order, count[None, :] <= (k + 1)[:, None].double())
    return torch.where(kept & (y != 0), torch.sign(y), torch.zeros_like(y)).to(torch.int64)


def pack_trits(codes: torch.Tensor) -> torch.Tensor:
    """uint8 bytes of codes in {0, 1, 2}, 5 a byte: byte = sum of code_j 3^j, the first code least significant."""
    flat = codes.reshape(-1).to(torch.int64)
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % 5)).reshape(-1, 5)
    return (padded * torch.tensor(_TRIT_WEIGHTS)).sum(dim=1).to(torch.uint8)


def unpack_trits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The first n codes of `packed` (the inverse of pack_trits), int64."""
    data = packed.reshape(-1).to(torch.int64)
    if n > 5 * data.numel():
        raise CodecError(f"unpack_trits: {data.numel()} bytes hold {5 * data.numel()} trits, not {n}")
    return (data[:, None] // torch.tensor(_TRIT_WEIGHTS) % 3).reshape(-1)[:n]
