"""Codecs that only change the float format: `none` (fp32), `fp16`, `bf16`.

Each value is cast to the wire dtype (round to nearest even) and back. Relative error per value:
0 for fp32 inputs under `none`, <= 2**-11 for fp16 (normal range, |x| >= 2**-14; below that the
absolute error is <= 2**-25), <= 2**-8 for bf16. Finite values that overflow the wire format
(|x| > 65504 for fp16) raise CodecError rather than silently becoming inf. These payloads can be
summed in compressed form (`summable`), which is what fp16 all-reduce hooks do.
"""

from __future__ import annotations

import torch

from geotrain.codecs.base import BufferSpec, Codec, Payload, extremes, numel_of
from geotrain.codecs.buffers import converted


class CastCodec(Codec):
    """Send the tensor as `wire_float_dtype`; decode casts back to the input dtype."""

    wire_float_dtype: torch.dtype = torch.float32
    summable = True

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        wire = converted(x, self.wire_float_dtype)
        # NaN/inf in the wire values (min or max non-finite) came in, or the cast overflowed.
        self._raise_if_nonfinite(x, extremes(wire), wire=wire)
        return Payload(self.name, {"values": wire}, tuple(tensor.shape), tensor.dtype)

    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        return (BufferSpec("values", self.wire_float_dtype, (payload.numel,)),)

    def _decode(self, payload: Payload) -> torch.Tensor:
        return converted(payload.buffers["values"], payload.dtype).reshape(payload.shape)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        return numel_of(shape) * torch.empty((), dtype=self.wire_float_dtype).element_size()


class NoneCodec(CastCodec):
    """No compression: fp32 on the wire (4 bytes per value)."""

    name = "none"
    exact = True
    wire_float_dtype = torch.float32

    def bytes_per_value(self, hidden: int, trained_bytes: float) -> float:
        """Uncompressed: the values as trained."""
        return float(trained_bytes)


class Fp16Codec(CastCodec):
    """IEEE half precision on the wire (2 bytes per value)."""

    name = "fp16"
    wire_float_dtype = torch.float16


class Bf16Codec(CastCodec):
    """bfloat16 on the wire (2 bytes per value): fp32's range, 8 bits of precision."""

    name = "bf16"
    wire_float_dtype = torch.bfloat16


