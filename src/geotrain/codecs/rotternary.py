"""`rotated-ternary`: rotated-sign's random rotation, then ternary codes ({-s, 0, +s}) and one scale per block.

Each whole block of `block_size` (a power of two) values is rotated as rotated-sign rotates it
(geotrain.codecs.rotsign: y = H D x / sqrt(b), the key drawn from the input and sent with the payload); a shorter
last block is coded unrotated. Two codes t of the rotated values, both deterministic, each with rotated-sign's
scale s = |y|^2 / <y, t> per block (the projection on the input is exact, <x', x> = |x|^2; what is left is
orthogonal noise, its energy e / (1 - e) |x|^2 where e is the relative error of the least-squares fit of t):
- `group=1`: one trit per value, packed 5 to a byte (3^5 = 243 <= 256: 1.6 bits a value). A block keeps the
  signs of its k largest |y| and zeroes the rest, k = argmax (sum of the k largest |y|)^2 / k (the best
  least-squares fit): noise about 0.23 |x|^2 for Gaussian-like y, against rotated-sign's 0.57.
- `group=4`: each run of 4 values as one of the 32 ternary 4-vectors with one or two nonzeros, a 5-bit index
  (1.25 bits a value): the sign of the largest |y| of the four, and of the second too where it is more than
  (sqrt 2 - 1) times the largest (the codeword nearest y's direction): noise about 0.39 |x|^2 for Gaussian-like
  y, at sign-block's bits (scales per 512 values in bf16 or per 1024 in fp32 keep it within 1.3 bits a value).

Wire bytes: ceil(n / 5) (group 1) or ceil(5 ceil(n / 4) / 8) (group 4), plus 4 per scale (2 with
`scale_dtype=bf16`), ceil(n / block_size) scales, plus the 8-byte key. Zeros decode to zeros; NaN/inf are refused
unless allow_nonfinite (then their block decodes to NaN).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from geotrain.codecs.base import BufferSpec, Codec, CodecError, Payload, numel_of, parse_count
from geotrain.codecs.dtypes import float_dtype, itemsize
from geotrain.codecs.rotsign import rotate, rotation_key, unrotate

_SCALE_DTYPES = ("fp32", "bf16")
"""Names scale_dtype takes (geotrain.codecs.dtypes)."""

_GROUPS = (1, 4)
"""Values per code: 1 (a trit each) or 4 (one of 32 ternary 4-vectors)."""

_INDEX_BITS = 5
"""Bits per group-4 index (32 codewords)."""


class RotatedTernaryCodec(Codec):
    """Randomised Hadamard rotation per block, ternary codes (per value or per 4 values), one scale per block."""

    name = "rotated-ternary"

    def __init__(self, *, block_size: int = 128, group: int = 1, seed: int = 0, scale_dtype: str = "fp32",
                 allow_nonfinite: bool = False) -> None:
        super().__init__(allow_nonfinite=allow_nonfinite)
        block = parse_count(block_size, "rotated-ternary: block_size", minimum=1)
        if block & (block - 1):
            raise CodecError(f"rotated-ternary: block_size must be a power of two, got {block_size!r}")
        self.group = parse_count(group, "rotated-ternary: group", minimum=1)
        if self.group not in _GROUPS:
            raise CodecError(f"rotated-ternary: group must be 1 or 4, got {group!r}")
        if block % self.group:
            raise CodecError(f"rotated-ternary: block_size={block} with group={self.group}: a block must hold "
                             f"whole groups")
        self.block_size = block
        self.seed = parse_count(seed, "rotated-ternary: seed")
        self.scale_dtype = scale_dtype
        self.scale_torch_dtype = float_dtype(scale_dtype, "rotated-ternary: scale_dtype", _SCALE_DTYPES)

    def params(self) -> dict[str, Any]:
        more = {"scale_dtype": self.scale_dtype} if self.scale_dtype != "fp32" else {}
        return {"block_size": self.block_size, "group": self.group, "seed": self.seed, **more, **super().params()}

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        flat = x.reshape(-1).to(torch.float32)
        key = rotation_key(flat, self.seed, self.step)
        n, block = flat.numel(), self.block_size
        whole = n // block * block
        rows = [rotate(flat[:whole].double().reshape(-1, block), key), flat[whole:].double().reshape(1, -1)]
        coded = [self._code(part) for part in rows if part.numel()]
        codes = torch.cat([c.reshape(-1) for c, _ in coded]) if coded else torch.zeros(0, dtype=torch.int64)
        scales = torch.cat([s for _, s in coded]) if coded else torch.zeros(0, dtype=torch.float64)
        wire = scales.to(self.scale_torch_dtype)
        probe = sum(float(part.abs().sum()) for part in rows) + wire.double().sum()
        self._raise_if_nonfinite(x, probe, wire=wire)
        packed = pack_trits(codes) if self.group == 1 else pack_indices(codes)
        return Payload(self.name, {"codes": packed, "scales": wire, "key": torch.tensor([key], dtype=torch.int64)},
                       tuple(tensor.shape), tensor.dtype, {"block_size": self.block_size, "group": self.group})

    def _code(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes, scale per row) of float64 `rows` (rows, b): trits in {0, 1, 2} per value (group 1) or a
        codeword index per 4 values (group 4, the row padded with zeros to whole groups); a row with NaN/inf
        gets a NaN scale."""
        finite = torch.isfinite(rows).all(dim=1)
        y = torch.where(torch.isfinite(rows), rows, torch.zeros_like(rows))
        if self.group == 1:
            trits = _best_ternary(y)
            codes, words = trits + 1, trits.to(torch.float64)
        else:
            pad = -y.shape[1] % 4
            vectors = torch.nn.functional.pad(y, (0, pad)).reshape(y.shape[0], -1, 4)
            words = _nearest_codeword(vectors)
            codes = _word_index(words)
        along = (y * words.reshape(y.shape[0], -1)[:, :y.shape[1]]).sum(dim=1)
        scale = torch.where(along == 0, torch.zeros_like(along), (y * y).sum(dim=1) / along)
        return codes, torch.where(finite, scale, torch.full_like(scale, math.nan))

    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        block = self._meta_count(payload, "block_size", self.block_size, minimum=1, maximum=1 << 30)
        group = self._meta_count(payload, "group", self.group, minimum=1, maximum=4)
        if block & (block - 1) or group not in _GROUPS or block % group:
            raise CodecError(f"'rotated-ternary' payload meta: block_size {block} with group {group} is not a code")
        return (BufferSpec("codes", torch.uint8, (_code_nbytes(payload.numel, group),)),
                BufferSpec("scales", self.scale_torch_dtype, (-(-payload.numel // block),)),
                BufferSpec("key", torch.int64, (1,)))

    def _decode(self, payload: Payload) -> torch.Tensor:
        block = self._meta_count(payload, "block_size", self.block_size, minimum=1)
        group = self._meta_count(payload, "group", self.group, minimum=1, maximum=4)
        n = payload.numel
        whole = n // block * block
        if group == 1:
            unit = unpack_trits(payload.buffers["codes"], n).to(torch.float64) - 1
        else:  # only the last, shorter block is padded to whole groups, so the first n values are the code's
            count = -(-n // 4)
            unit = _codebook()[unpack_indices(payload.buffers["codes"], count)].reshape(-1)[:n]
        values = unit * payload.buffers["scales"].to(torch.float64).repeat_interleave(block)[:n]
        head = unrotate(values[:whole].reshape(-1, block), int(payload.buffers["key"][0]))
        return torch.cat([head.reshape(-1), values[whole:]]).to(payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        n = numel_of(shape)
        return _code_nbytes(n, self.group) + itemsize(self.scale_torch_dtype) * (-(-n // self.block_size)) + 8


def _code_nbytes(n: int, group: int) -> int:
    """Bytes of the packed codes of n values: 5 trits a byte (group 1) or 5 bits per 4 values (group 4)."""
    return -(-n // 5) if group == 1 else -(-_INDEX_BITS * -(-n // 4) // 8)


def _best_ternary(y: torch.Tensor) -> torch.Tensor:
    """Trits in {-1, 0, 1} (int64) nearest each row of float64 `y` in direction: the signs of the k largest |y|,
    k = argmax (sum of the k largest)^2 / k (the k whose least-squares fit s t errs least)."""
    magnitude, order = y.abs().sort(dim=1, descending=True)
    total = magnitude.cumsum(dim=1)
    count = torch.arange(1, y.shape[1] + 1, dtype=torch.float64)
    k = (total * total / count).argmax(dim=1)
    kept = torch.zeros_like(y, dtype=torch.bool).scatter(1, order, count[None, :] <= (k + 1)[:, None].double())
    trits = torch.where(kept & (y != 0), torch.sign(y), torch.zeros_like(y)).to(torch.int64)
    return trits


def _nearest_codeword(vectors: torch.Tensor) -> torch.Tensor:
    """The ternary codeword (one or two +-1 entries) nearest each 4-vector's direction, float64 (..., 4)."""
    magnitude, order = vectors.abs().sort(dim=-1, descending=True)
    keep = torch.ones_like(magnitude, dtype=torch.bool)
    keep[..., 1] = magnitude[..., 1] > (math.sqrt(2) - 1) * magnitude[..., 0]
    keep[..., 2:] = False
    mask = torch.zeros_like(keep).scatter(-1, order, keep)
    return torch.where(mask, torch.where(vectors < 0, -1.0, 1.0).to(torch.float64), torch.zeros_like(vectors))


def _codebook() -> torch.Tensor:
    """The 32 ternary 4-vectors with one or two nonzeros, float64 (32, 4), in index order: one nonzero first."""
    words = [v for k in (1, 2) for v in _with_nonzeros(k)]
    return torch.tensor(words, dtype=torch.float64)


def _with_nonzeros(k: int) -> list[list[float]]:
    """The ternary 4-vectors with exactly k nonzeros, in a fixed order."""
    out = []
    for code in range(81):
        digits = [code // 3 ** i % 3 - 1 for i in range(4)]
        if sum(d != 0 for d in digits) == k:
            out.append([float(d) for d in digits])
    return out


def _word_index(words: torch.Tensor) -> torch.Tensor:
    """The codebook index of each codeword of float64 `words` (..., 4) (via its base-3 number)."""
    lookup = torch.full((81,), -1, dtype=torch.int64)
    book = _codebook()
    lookup[((book + 1) * torch.tensor([1.0, 3.0, 9.0, 27.0], dtype=torch.float64)).sum(dim=1).long()] = \
        torch.arange(book.shape[0])
    return lookup[((words + 1) * torch.tensor([1.0, 3.0, 9.0, 27.0], dtype=torch.float64)).sum(dim=-1).long()]


def pack_trits(trits: torch.Tensor) -> torch.Tensor:
    """uint8 bytes of codes in {0, 1, 2}, 5 a byte: byte = sum of code_j 3^j, the first code least significant."""
    flat = trits.reshape(-1).to(torch.int64)
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % 5)).reshape(-1, 5)
    return (padded * torch.tensor([1, 3, 9, 27, 81])).sum(dim=1).to(torch.uint8)


def unpack_trits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The first n codes of `packed` (the inverse of pack_trits), int64."""
    data = packed.reshape(-1).to(torch.int64)
    if n > 5 * data.numel():
        raise CodecError(f"unpack_trits: {data.numel()} bytes hold {5 * data.numel()} trits, not {n}")
    return (data[:, None] // torch.tensor([1, 3, 9, 27, 81]) % 3).reshape(-1)[:n]


def pack_indices(indices: torch.Tensor) -> torch.Tensor:
    """uint8 bytes of 5-bit indices as one little-endian bit stream (index j at bits 5j .. 5j + 4)."""
    flat = indices.reshape(-1).to(torch.int64).numpy()
    bits = ((flat[:, None] >> np.arange(_INDEX_BITS)) & 1).astype(np.uint8).reshape(-1)
    return torch.from_numpy(np.packbits(bits, bitorder="little"))


def unpack_indices(packed: torch.Tensor, count: int) -> torch.Tensor:
    """The first `count` 5-bit indices of `packed` (the inverse of pack_indices), int64."""
    data = packed.reshape(-1).to(torch.uint8).numpy()
    if _INDEX_BITS * count > 8 * data.size:
        raise CodecError(f"unpack_indices: {data.size} bytes hold {8 * data.size // _INDEX_BITS} indices, not {count}")
    bits = np.unpackbits(data, bitorder="little")[:_INDEX_BITS * count].reshape(count, _INDEX_BITS)
    return torch.from_numpy((bits.astype(np.int64) << np.arange(_INDEX_BITS)).sum(axis=1))
