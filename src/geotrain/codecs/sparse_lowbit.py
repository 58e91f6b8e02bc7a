"""`topk-lowbit`: the largest magnitudes of each chunk, their positions and low-bit values (SparseLoCo style).

The flattened tensor is cut into chunks of `chunk_size` values (the last may be shorter). Each chunk
keeps its k = min(chunk_size, max(1, int(fraction * chunk_size))) largest magnitudes (the last chunk
min(k, its length)); everything else decodes to zero. What travels per chunk:
- the kept positions inside the chunk, ascending, as uint16 (so chunk_size <= 65536);
- the kept values as `bits`-bit codes on the grid of geotrain.codecs.lowbit (bits=2: levels
  {-1, -1/3, 1/3, 1}, bits=4: k/7) of the chunk's peak, packed 8/bits per byte;
- the chunk's peak (max |x|, always kept) as one fp32 scale.

Wire bytes: 2K + ceil(K * bits / 8) + 4 * chunks, K the values kept in all. Defaults (fraction 1/64,
chunk 4096, 2 bits): 64 values per chunk, (64 * 2.25 + 4) / 4096 = 0.036 bytes per value (fp32: 4).
Error: a kept value is off by at most half the grid's widest gap times its chunk peak; a dropped
value is no larger in magnitude than the smallest kept one of its chunk. With error feedback (the
codec reducer's residuals) nothing is lost, only delayed: what SparseLoCo relies on.
"""

from __future__ import annotations

from typing import Any

import torch

from geotrain.codecs.base import BufferSpec, Codec, CodecError, Payload, extremes, numel_of
from geotrain.codecs.lowbit import GRIDS, dequantize_blocks, pack_codes, quantize_blocks, unpack_codes

MAX_CHUNK = 1 << 16
"""Positions inside a chunk travel as uint16."""
_GRID_OF_BITS = {2: "int2", 4: "int4"}


class TopKLowBitCodec(Codec):
    """Per-chunk top-k: uint16 positions, `bits`-bit values and one fp32 peak per chunk (module doc)."""

    name = "topk-lowbit"

    def __init__(self, *, fraction: float = 1 / 64, chunk_size: int = 4096, bits: int = 2,
                 allow_nonfinite: bool = False) -> None:
        super().__init__(allow_nonfinite=allow_nonfinite)
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
            raise CodecError(f"{self.name}: fraction must be a number in (0, 1], got {fraction!r}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or not 1 <= chunk_size <= MAX_CHUNK:
            raise CodecError(f"{self.name}: chunk_size must be an integer in 1..{MAX_CHUNK}, got {chunk_size!r}")
        if bits not in _GRID_OF_BITS or isinstance(bits, bool):
            raise CodecError(f"{self.name}: bits must be one of {sorted(_GRID_OF_BITS)}, got {bits!r}")
        self.fraction = float(fraction)
        self.chunk_size = chunk_size
        self.bits = bits
        self.grid = GRIDS[_GRID_OF_BITS[bits]][1]

    def params(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "chunk_size": self.chunk_size, "bits": self.bits, **super().params()}

    @property
    def k_per_chunk(self) -> int:
        """Values kept from each full chunk."""
        return min(self.chunk_size, max(1, int(self.fraction * self.chunk_size)))

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        flat = x.reshape(-1).to(torch.float32)
        self._raise_if_nonfinite(x, extremes(flat))
        chunk, k = self.chunk_size, self.k_per_chunk
        positions, values = self._select(flat, chunk, k)
        codes, peaks = quantize_blocks(values, k, self.grid)
        self._raise_if_nonfinite(x, peaks, wire=peaks)
        buffers = {"indices": positions.to(torch.uint16), "codes": pack_codes(codes, self.bits), "scales": peaks}
        return Payload(self.name, buffers, tuple(tensor.shape), tensor.dtype, {"chunk_size": chunk, "k": k})

    @staticmethod
    def _select(flat: torch.Tensor, chunk: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Kept positions inside each chunk (ascending) and their values, chunk after chunk."""
        n = flat.numel()
        if n == 0:
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0)
        rows = -(-n // chunk)
        magnitude = torch.full((rows * chunk,), -1.0)  # padding is never kept: every |x| >= 0 beats it
        magnitude[:n] = flat.abs()
        top = torch.topk(magnitude.view(rows, chunk), min(k, chunk), dim=1).indices
        last = top[-1][:min(k, n - (rows - 1) * chunk)].sort().values  # topk sorts by magnitude: padding last
        full = top[:-1].sort(dim=1).values
        positions = torch.cat([full.reshape(-1), last])
        offsets = torch.cat([(torch.arange(rows - 1) * chunk).repeat_interleave(full.shape[1]),
                             torch.full((last.numel(),), (rows - 1) * chunk)])
        return positions, flat[positions + offsets]

    def _layout(self, payload: Payload) -> tuple[int, int, int, int]:
        """(chunk, k, values kept K, chunks) of a payload, from its shape and meta."""
        chunk = self._meta_count(payload, "chunk_size", self.chunk_size, minimum=1, maximum=MAX_CHUNK)
        k = self._meta_count(payload, "k", self.k_per_chunk, minimum=1, maximum=chunk)
        return (chunk, k, *kept_values(payload.numel, chunk, k))

    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        _, _, kept, rows = self._layout(payload)
        return (BufferSpec("indices", torch.uint16, (kept,)),
                BufferSpec("codes", torch.uint8, (-(-kept * self.bits // 8),)),
                BufferSpec("scales", torch.float32, (rows,)))

    def _decode(self, payload: Payload) -> torch.Tensor:
        chunk, k, kept, _ = self._layout(payload)
        n = payload.numel
        where = f"{self.name!r} payload of shape {payload.shape}"
        codes = unpack_codes(payload.buffers["codes"], self.bits, kept)
        values = dequantize_blocks(codes, payload.buffers["scales"], k, self.grid, where)
        local = payload.buffers["indices"].to(torch.int64)
        row = torch.arange(kept) // k
        position = row * chunk + local
        if kept and (int(local.max()) >= chunk or int(position.max()) >= n):
            raise CodecError(f"{where}: positions must lie inside their chunk of {chunk} values and the "
                             f"tensor's {n}, got {int(local.max())} in chunk {int(row[position.argmax()])}")
        out = torch.zeros(n, dtype=torch.float32)
        out[position] = values
        return out.to(payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        kept, rows = kept_values(numel_of(shape), self.chunk_size, self.k_per_chunk)
        return 2 * kept + -(-kept * self.bits // 8) + 4 * rows


def kept_values(n: int, chunk: int, k: int) -> tuple[int, int]:
    """(values kept in all, chunks) of n values in chunks of `chunk`, k kept per chunk."""
    rows = -(-n // chunk)
    return (0 if n == 0 else (rows - 1) * k + min(k, n - (rows - 1) * chunk)), rows
