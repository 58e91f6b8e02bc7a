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
GPT spans ten decades of exp_avg_sq, and int8-block sent it to ruin; docs/diloco.md, "Moment sync").

    bits  magnitude levels  wire bytes per value (block 128)
    4     7                 0.5625
    8     127               1.0625

A block without non-zero values has lo = hi = 0 and decodes to zeros. NaN/inf: refused (NonFiniteGradientError)
unless allow_nonfinite, and then the block decodes to NaN. Codes are packed as geotrain.codecs.lowbit packs them.
"""

from __future__ import annotations

from typing import Any

import torch

from geotrain.codecs.base import BufferSpec, Codec, CodecError, Payload, numel_of
from geotrain.codecs.lowbit import pack_codes, unpack_codes

LOG_BITS = (4, 8)


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
        flat = x.reshape(-1).to(torch.float32)
        n, block = flat.numel(), self.block_size
        blocks = -(-n // block)
        padded = torch.zeros(blocks * block, dtype=torch.float32)
        padded[:n] = flat
        grid = padded.view(blocks, block)
        magnitude = grid.abs()
        finite = torch.isfinite(magnitude).all(dim=1)
        check = torch.where(finite, 0.0, float("nan"))  # NaN per block holding NaN/inf (after the fp32 cast)
        self._raise_if_nonfinite(x, check.sum(), wire=check)
        nonzero = (magnitude > 0) & torch.isfinite(magnitude)
        logs = torch.log(torch.where(nonzero, magnitude, torch.ones_like(magnitude)))
        lo = torch.where(nonzero, logs, torch.full_like(logs, float("inf"))).amin(dim=1)
        hi = torch.where(nonzero, logs, torch.full_like(logs, float("-inf"))).amax(dim=1)
        empty = ~nonzero.any(dim=1)
        lo = torch.where(empty, 0.0, lo)
        hi = torch.where(empty, 0.0, hi)
        span = (hi - lo).clamp_min(torch.finfo(torch.float32).tiny)
        # magnitude level k - 1 in 0..K-1: the level nearest in the log domain, ties to the lower one
        position = (logs - lo[:, None]) / span[:, None] * (self.levels - 1)
        k = torch.ceil(position - 0.5).clamp(0, self.levels - 1).to(torch.uint8) + 1
        k = torch.where(nonzero, k, torch.zeros_like(k))
        sign = (grid < 0).to(torch.uint8) << (self.bits - 1)
        codes = (sign | k).reshape(-1)[:n]
        lo = torch.where(finite, lo, float("nan"))
        return Payload(self.name, {"codes": pack_codes(codes, self.bits), "bounds": torch.stack([lo, hi], 1).reshape(-1)},
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
        n = payload.numel
        codes = unpack_codes(payload.buffers["codes"], self.bits, n).to(torch.int64)
        bounds = payload.buffers["bounds"].view(-1, 2)
        which = torch.arange(n) // block
        lo, hi = bounds[which, 0], bounds[which, 1]
        k = codes & self.levels
        negative = (codes >> (self.bits - 1)) & 1
        step = (hi - lo) / max(self.levels - 1, 1)
        magnitude = torch.exp(lo + (k - 1).clamp_min(0).to(torch.float32) * step)
        values = torch.where(k == 0, torch.zeros_like(magnitude), magnitude)
        values = torch.where(torch.isnan(lo), torch.full_like(values, float("nan")), values)
        values = torch.where(negative.bool(), -values, values)
        return values.to(payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        n = numel_of(shape)
        return -(-n * self.bits // 8) + 8 * (-(-n // self.block_size))
