"""`rotated-ternary`: rotated-sign's random rotation, then ternary codes ({-s, 0, +s}) and one scale per block.

Each whole block of `block_size` (a power of two) values is rotated as rotated-sign rotates it
(geotrain.codecs.rotsign: y = H D x / sqrt(b), the key drawn from the input and sent with the payload); a shorter
last block is coded unrotated. Ternary codes t of the rotated values, all deterministic, each with rotated-sign's
scale s = |y|^2 / <y, t> per block (the projection on the input is exact, <x', x> = |x|^2; what is left is
orthogonal noise, its energy e / (1 - e) |x|^2 where e is the relative error of the least-squares fit of t):
- `group=1`: one trit per value, packed 5 to a byte (3^5 = 243 <= 256: 1.6 bits a value). A block keeps the
  signs of its k largest |y| and zeroes the rest, k = argmax (sum of the k largest |y|)^2 / k (the best
  least-squares fit): noise about 0.23 |x|^2 for Gaussian-like y, against rotated-sign's 0.57.
- `group=4`: each run of 4 values as one of the 32 ternary 4-vectors with one or two nonzeros, a 5-bit index
  (1.25 bits a value: sign-block's bits). Starting from the scale s of the block's best uncapped ternary code,
  each group keeps the signs of its values above s / 2, at least the largest and at most two, and s is refitted;
  twice (Lloyd). Noise about 0.36 |x|^2 for Gaussian-like y, at rotated-sign's bytes where its scales are fewer
  (bf16 per 512 values: within the 1.30 bits a value of bench pipeline's 20x).

Wire bytes: ceil(n / 5) (group 1) or ceil(5 ceil(n / 4) / 8) (group 4), plus 4 per scale (2 with `scale_dtype=bf16`), ceil(n / block_size) scales, plus the 8-byte key. Zeros decode to zeros; NaN/inf are refused
unless allow_nonfinite (then their block decodes to NaN).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

from geotrain.codecs.base import BufferSpec, Codec, CodecError, Payload, numel_of, parse_count
from geotrain.codecs.dtypes import float_dtype, itemsize
from geotrain.codecs.rotsign import rotate, rotation_key, unrotate

_SCALE_DTYPES = ("fp32", "bf16")
"""Names scale_dtype takes (geotrain.codecs.dtypes)."""

_MOST_NONZEROS = {4: 2}
"""Values per code (`group`) beyond 1, and the most nonzeros its codewords hold (at least one): 32 codewords of
4 values, 5-bit indices."""

_GROUPS = (1, *_MOST_NONZEROS)
"""Values per code: 1 (a trit each) or 4 (a codeword index per group)."""

_LLOYD_ROUNDS = 2
"""Rounds of (codewords for the scale, scale for the codewords) after the uncapped ternary's scale."""


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
        packed = pack_trits(codes) if self.group == 1 else pack_indices(codes, _index_bits(self.group))
        return Payload(self.name, {"codes": packed, "scales": wire, "key": torch.tensor([key], dtype=torch.int64)},
                       tuple(tensor.shape), tensor.dtype, {"block_size": self.block_size, "group": self.group})

    def _code(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes, scale per row) of float64 `rows` (rows, b): trits in {0, 1, 2} per value (group 1) or a
        codeword index per group (the row padded with zeros to whole groups); a row with NaN/inf gets a NaN
        scale."""
        finite = torch.isfinite(rows).all(dim=1)
        y = torch.where(torch.isfinite(rows), rows, torch.zeros_like(rows))
        trits = _best_ternary(y)
        if self.group == 1:
            codes, words = trits + 1, trits.to(torch.float64)
        else:
            vectors = torch.nn.functional.pad(y, (0, -y.shape[1] % self.group)).reshape(y.shape[0], -1, self.group)
            words = _capped_ternary(vectors, _MOST_NONZEROS[self.group], _fit(y, trits.to(torch.float64)))
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
            indices = unpack_indices(payload.buffers["codes"], -(-n // group), _index_bits(group))
            unit = _codebook(group)[indices].reshape(-1)[:n]
        values = unit * payload.buffers["scales"].to(torch.float64).repeat_interleave(block)[:n]
        head = unrotate(values[:whole].reshape(-1, block), int(payload.buffers["key"][0]))
        return torch.cat([head.reshape(-1), values[whole:]]).to(payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        n = numel_of(shape)
        return _code_nbytes(n, self.group) + itemsize(self.scale_torch_dtype) * (-(-n // self.block_size)) + 8


def _code_nbytes(n: int, group: int) -> int:
    """Bytes of the packed codes of n values: 5 trits a byte (group 1) or an index per `group` values."""
    return -(-n // 5) if group == 1 else -(-_index_bits(group) * -(-n // group) // 8)


@functools.cache
def _index_bits(group: int) -> int:
    """Bits of a codeword index of `group` values (5 for 4)."""
    return (len(_codebook(group)) - 1).bit_length()


def _best_ternary(y: torch.Tensor) -> torch.Tensor:
    """Trits in {-1, 0, 1} (int64) nearest each row of float64 `y` in direction: the signs of the k largest |y|,
    k = argmax (sum of the k largest)^2 / k (the k whose least-squares fit s t errs least)."""
    magnitude, order = y.abs().sort(dim=1, descending=True)
    total = magnitude.cumsum(dim=1)
    count = torch.arange(1, y.shape[1] + 1, dtype=torch.float64)
    k = (total * total / count).argmax(dim=1)
    kept = torch.zeros_like(y, dtype=torch.bool).scatter(1, order, count[None, :] <= (k + 1)[:, None].double())
    return torch.where(kept & (y != 0), torch.sign(y), torch.zeros_like(y)).to(torch.int64)


def _fit(y: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """The least-squares scale <y, t> / |t|^2 of each row (0 where t is zero)."""
    norm2 = (words * words).sum(dim=1)
    return torch.where(norm2 == 0, torch.zeros_like(norm2), (y * words).sum(dim=1) / norm2.clamp(min=1))


def _capped_ternary(vectors: torch.Tensor, most: int, scale: torch.Tensor) -> torch.Tensor:
    """Float64 codewords (rows, groups, g) of `vectors`: per group the signs of the values above half the row's
    scale, at least the largest and at most `most` of them (the largest), then the scale refitted to them,
    _LLOYD_ROUNDS times from `scale`."""
    rows, _, g = vectors.shape
    magnitude, order = vectors.abs().sort(dim=-1, descending=True)
    rank = torch.arange(g)
    signs = torch.where(vectors < 0, -1.0, 1.0).to(torch.float64)
    words = torch.zeros_like(vectors)
    for _ in range(_LLOYD_ROUNDS):
        keep = (rank < most) & ((magnitude > scale[:, None, None] / 2) | (rank == 0))
        mask = torch.zeros_like(keep).scatter(-1, order, keep)
        words = torch.where(mask, signs, torch.zeros_like(vectors))
        scale = _fit(vectors.reshape(rows, -1), words.reshape(rows, -1))
    return words


@functools.cache
def _codebook(group: int) -> torch.Tensor:
    """The codewords of `group` values, float64 (count, group), in index order (their base-3 numbers, ascending):
    ternary vectors with 1 to _MOST_NONZEROS[group] nonzeros. Cached: read, never written."""
    digits = torch.arange(3 ** group)[:, None] // 3 ** torch.arange(group) % 3 - 1
    nonzeros = (digits != 0).sum(dim=1)
    return digits[(nonzeros >= 1) & (nonzeros <= _MOST_NONZEROS[group])].to(torch.float64)


def _word_index(words: torch.Tensor) -> torch.Tensor:
    """The codebook index of each codeword of float64 `words` (..., g) (via its base-3 number)."""
    g = words.shape[-1]
    return _index_of_base3(g)[((words + 1) * 3 ** torch.arange(g, dtype=torch.float64)).sum(dim=-1).long()]


@functools.cache
def _index_of_base3(group: int) -> torch.Tensor:
    """int64 (3^group,): the codebook index of each base-3 number, -1 where it is no codeword. Cached: read only."""
    book = _codebook(group)
    lookup = torch.full((3 ** group,), -1, dtype=torch.int64)
    lookup[((book + 1) * 3 ** torch.arange(group, dtype=torch.float64)).sum(dim=1).long()] = torch.arange(len(book))
    return lookup


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


def pack_indices(indices: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 bytes of `bits`-bit indices as one little-endian bit stream (index j at bits j bits .. (j + 1) bits - 1)."""
    flat = indices.reshape(-1).to(torch.int64).numpy()
    stream = ((flat[:, None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(-1)
    return torch.from_numpy(np.packbits(stream, bitorder="little"))


def unpack_indices(packed: torch.Tensor, count: int, bits: int) -> torch.Tensor:
    """The first `count` `bits`-bit indices of `packed` (the inverse of pack_indices), int64."""
    data = packed.reshape(-1).to(torch.uint8).numpy()
    if bits * count > 8 * data.size:
        raise CodecError(f"unpack_indices: {data.size} bytes hold {8 * data.size // bits} indices, not {count}")
    stream = np.unpackbits(data, bitorder="little")[:bits * count].reshape(count, bits)
    return torch.from_numpy((stream.astype(np.int64) << np.arange(bits)).sum(axis=1))
