"""`sign`: one bit per value, packed 8 per byte, plus one fp32 scale = mean |x| (as the seed).

Wire: ceil(n / 8) bytes of bits (bit i of byte j is value 8j + i, least significant bit first, the
layout of numpy.packbits(bitorder="little"); 1 = negative) + 4 bytes of scale: 1/8 + 4/n bytes per
value. Decoding gives -scale for a set bit and +scale otherwise.

Zeros: one bit cannot say "zero", so sign(0) decodes to +scale (and -0.0 to +scale too: the bit is
x < 0). This differs from the seed's `g.sign() * mean|g|`, which sends 0 for exact zeros, only in
that case. An all-zero tensor has scale 0 and decodes to zeros; every non-zero value keeps its sign
whenever the scale is positive.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from geotrain.codecs.base import BufferSpec, Codec, Payload, numel_of
from geotrain.codecs.buffers import new_buffer


class SignCodec(Codec):
    """Packed sign bits and the mean magnitude."""

    name = "sign"

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        flat = x.reshape(-1).to(torch.float32)
        n = flat.numel()
        values = flat.numpy()
        # float64 accumulation: exact enough for any n, and NaN/inf propagate into the scale.
        scale = torch.tensor([_abs_sum(values) / n if n else 0.0], dtype=torch.float32)
        self._raise_if_nonfinite(x, scale, wire=scale)
        return Payload(self.name, {"bits": pack_sign_bits(flat), "scale": scale}, tuple(tensor.shape), tensor.dtype)

    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        return BufferSpec("bits", torch.uint8, (-(-payload.numel // 8),)), BufferSpec("scale", torch.float32, (1,))

    def _decode(self, payload: Payload) -> torch.Tensor:
        out = new_buffer(payload.numel, torch.float32)
        scale = np.float32(payload.buffers["scale"].reshape(-1)[0].item())
        _unpack_signs(payload.buffers["bits"].contiguous().numpy(), scale, out.numpy())
        return out.to(payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        return -(-numel_of(shape) // 8) + 4


def pack_sign_bits(flat: torch.Tensor) -> torch.Tensor:
    """uint8 tensor of ceil(n / 8) bytes: bit i of byte j is set iff flat[8j + i] < 0. On the tensor's device
    (a GPU tensor's bits are packed there: `pack_sign_bits_torch`)."""
    if flat.device.type != "cpu":
        return pack_sign_bits_torch(flat)
    values = flat.detach().reshape(-1).to(torch.float32).contiguous().numpy()
    packed = new_buffer(-(-values.size // 8), torch.uint8)
    _pack_signs(values, packed.numpy())
    return packed


def unpack_sign_bits(bits: torch.Tensor, n: int) -> torch.Tensor:
    """Bool tensor of n values: True where the packed bit is set (the inverse of pack_sign_bits), on the bits'
    device."""
    if bits.device.type != "cpu":
        return unpack_sign_bits_torch(bits, n)
    return torch.from_numpy(np.unpackbits(bits.contiguous().numpy(), count=n, bitorder="little").astype(bool))


def _bit_shifts(device: torch.device) -> torch.Tensor:
    return torch.arange(8, dtype=torch.uint8, device=device)


def pack_sign_bits_torch(flat: torch.Tensor) -> torch.Tensor:
    """pack_sign_bits in torch operations on `flat`'s device (the same bytes; the numba kernel is host-only)."""
    negative = flat.detach().reshape(-1) < 0
    padded = torch.zeros(-(-negative.numel() // 8) * 8, dtype=torch.uint8, device=flat.device)
    padded[: negative.numel()] = negative.to(torch.uint8)
    return (padded.view(-1, 8) << _bit_shifts(flat.device)).sum(dim=1, dtype=torch.int32).to(torch.uint8)


def unpack_sign_bits_torch(bits: torch.Tensor, n: int) -> torch.Tensor:
    """unpack_sign_bits in torch operations on `bits`' device."""
    expanded = (bits.reshape(-1, 1) >> _bit_shifts(bits.device)) & 1
    return expanded.reshape(-1)[:n].bool()


# The kernels spell out the 8 bits of a byte: LLVM vectorises that form (a loop over i did not).
@njit(cache=True)
def _pack_signs(values, packed):  # pragma: no cover - compiled
    full = values.size // 8
    for j in range(full):
        b = 8 * j
        packed[j] = ((values[b] < 0) | ((values[b + 1] < 0) << 1) | ((values[b + 2] < 0) << 2)
                     | ((values[b + 3] < 0) << 3) | ((values[b + 4] < 0) << 4) | ((values[b + 5] < 0) << 5)
                     | ((values[b + 6] < 0) << 6) | ((values[b + 7] < 0) << 7))
    if values.size > 8 * full:
        byte = 0
        for i in range(values.size - 8 * full):
            byte |= (values[8 * full + i] < 0) << i
        packed[full] = byte


@njit(cache=True)
def _unpack_signs(packed, scale, out):  # pragma: no cover - compiled
    negative = -scale
    full = out.size // 8
    for j in range(full):
        byte = packed[j]
        b = 8 * j
        out[b] = negative if byte & 1 else scale
        out[b + 1] = negative if byte & 2 else scale
        out[b + 2] = negative if byte & 4 else scale
        out[b + 3] = negative if byte & 8 else scale
        out[b + 4] = negative if byte & 16 else scale
        out[b + 5] = negative if byte & 32 else scale
        out[b + 6] = negative if byte & 64 else scale
        out[b + 7] = negative if byte & 128 else scale
    for i in range(out.size - 8 * full):
        out[8 * full + i] = negative if (packed[full] >> i) & 1 else scale


@njit(cache=True, fastmath={"reassoc"})
def _abs_sum(values):  # pragma: no cover - compiled
    """sum |x| in float64; reassociation (no other fast-math) lets it vectorise, NaN/inf still propagate."""
    total = 0.0
    for i in range(values.size):
        total += abs(np.float64(values[i]))
    return total
