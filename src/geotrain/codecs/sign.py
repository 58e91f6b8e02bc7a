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

from geotrain.codecs.base import Codec, Payload, numel_of

# Row p holds the 8 signs (+1 / -1) that byte p encodes, least significant bit first.
_SIGN_TABLE = 1.0 - 2.0 * ((np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1).astype(np.float32)


class SignCodec(Codec):
    """Packed sign bits and the mean magnitude."""

    name = "sign"

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        flat = x.reshape(-1)
        n = flat.numel()
        if n:
            accumulate = torch.float64 if flat.dtype == torch.float64 else torch.float32
            scale = (torch.linalg.vector_norm(flat, 1, dtype=accumulate) / n).to(torch.float32).reshape(1)
        else:
            scale = torch.zeros(1)
        self._raise_if_nonfinite(x, scale, wire=scale)
        return Payload(self.name, {"bits": pack_sign_bits(flat), "scale": scale.contiguous()},
                       tuple(tensor.shape), tensor.dtype)

    def decode(self, payload: Payload) -> torch.Tensor:
        self._check_payload(payload, "bits", "scale")
        n = payload.numel
        scale = np.float32(payload.buffers["scale"].reshape(-1)[0].item())
        table = _SIGN_TABLE * scale
        # One table row (8 floats) per byte: the whole decode is a single gather.
        values = table[payload.buffers["bits"].numpy()].reshape(-1)[:n]
        return torch.from_numpy(values).to(payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        return -(-numel_of(shape) // 8) + 4


def pack_sign_bits(flat: torch.Tensor) -> torch.Tensor:
    """uint8 tensor of ceil(n / 8) bytes: bit i of byte j is set iff flat[8j + i] < 0."""
    negative = (flat < 0).numpy()
    return torch.from_numpy(np.packbits(negative, bitorder="little"))


def unpack_sign_bits(bits: torch.Tensor, n: int) -> torch.Tensor:
    """Bool tensor of n values: True where the packed bit is set (the inverse of pack_sign_bits)."""
    return torch.from_numpy(np.unpackbits(bits.numpy(), count=n, bitorder="little").astype(bool))
