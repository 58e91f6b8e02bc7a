"""How 1-bit Adam cuts the flat momentum into chunks and compresses a chunk to signs + scales.

The flat vector of all parameters (n values) is zero-padded to p equal chunks, chunk j being
reduced by rank j (Tang et al. 2021). Inside a chunk the values are grouped in *segments*: the
pieces of each parameter tensor that fall in the chunk. A compressed chunk is one wire message:

    message = sign bits (chunk_numel / 8 bytes, codecs.sign's packing: bit set = value < 0, least
              significant bit first) ++ float32 scale per segment

with scale = mean |x| over the segment (the scale that minimises ||x - scale * sign(x)||^2) and
the scale list zero-padded to the largest segment count of any chunk, so all messages have the same
size (`message_bytes`). Padding values decode to 0. Per-segment scales keep a small-gradient tensor
(a LayerNorm bias) from being rounded up to the scale of a large one in the same chunk.

`device`: where the layout's index tensors live and where it pads, encodes and decodes (the parameters' device:
1-bit Adam's state stays there; sign bits are packed on it, geotrain.codecs.sign).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from geotrain.codecs.sign import pack_sign_bits, unpack_sign_bits

_ALIGN = 32  # chunk_numel is a multiple of 32 so that the bit part is whole float32 words


class OneBitLayout:
    """Chunks and segments of a flat vector of `sum(param_numels)` values among `world_size` ranks."""

    def __init__(self, param_numels: Sequence[int], world_size: int, device: torch.device | str = "cpu") -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not param_numels or min(param_numels) < 1:
            raise ValueError(f"need at least one non-empty parameter, got sizes {list(param_numels)}")
        self.numel = int(sum(param_numels))
        self.world_size = world_size
        self.device = torch.device(device)
        per_chunk = -(-self.numel // world_size)
        self.chunk_numel = -(-per_chunk // _ALIGN) * _ALIGN
        self.padded_numel = self.chunk_numel * world_size
        param_starts = [0]
        for size in param_numels:
            param_starts.append(param_starts[-1] + int(size))
        self._ids: list[torch.Tensor] = []
        self._counts: list[torch.Tensor] = []
        segment_counts = []
        for chunk in range(world_size):
            lo, hi = chunk * self.chunk_numel, min((chunk + 1) * self.chunk_numel, self.numel)
            cuts = sorted({lo, hi} | {s for s in param_starts if lo < s < hi}) if hi > lo else []
            segment_counts.append(max(0, len(cuts) - 1))
            self._ids.append(self._segment_ids(cuts, lo))
        self.max_segments = max(segment_counts)
        for chunk, ids in enumerate(self._ids):
            ids.clamp_(max=self.max_segments)  # padding -> the dummy slot
            counts = torch.bincount(ids, minlength=self.max_segments + 1)[: self.max_segments]
            self._counts.append(counts.to(self.device, torch.float32))
        self._ids = [ids.to(self.device) for ids in self._ids]

    def _segment_ids(self, cuts: list[int], lo: int) -> torch.Tensor:
        ids = torch.full((self.chunk_numel,), 1 << 30, dtype=torch.int64)
        for segment, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
            ids[a - lo: b - lo] = segment
        return ids

    @property
    def bit_bytes(self) -> int:
        return self.chunk_numel // 8

    @property
    def message_bytes(self) -> int:
        """Wire bytes of one compressed chunk: packed signs plus the float32 scales."""
        return self.bit_bytes + 4 * self.max_segments

    def pad(self, flat: torch.Tensor) -> torch.Tensor:
        """The flat (n,) vector zero-padded to (padded_numel,)."""
        out = torch.zeros(self.padded_numel, dtype=torch.float32, device=self.device)
        out[: self.numel] = flat
        return out

    def chunk(self, padded: torch.Tensor, index: int) -> torch.Tensor:
        return padded[index * self.chunk_numel: (index + 1) * self.chunk_numel]

    def encode_chunk(self, values: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Compress chunk `index` (chunk_numel float32 values): (message uint8, what it decodes to)."""
        ids = self._ids[index]
        sums = torch.zeros(self.max_segments + 1, dtype=torch.float32, device=self.device).index_add_(0, ids,
                                                                                                   values.abs())
        scales = sums[: self.max_segments] / self._counts[index].clamp(min=1.0)
        message = torch.cat([pack_sign_bits(values), scales.view(torch.uint8)])
        return message, self._expand(values < 0, scales, ids)

    def decode_chunk(self, message: torch.Tensor, index: int) -> torch.Tensor:
        """The chunk_numel float32 values a message of chunk `index` stands for."""
        if message.numel() != self.message_bytes:
            raise ValueError(f"1-bit message of chunk {index} must be {self.message_bytes} bytes, got {message.numel()}")
        negative = unpack_sign_bits(message[: self.bit_bytes], self.chunk_numel)
        scales = message[self.bit_bytes:].clone().view(torch.float32)
        return self._expand(negative, scales, self._ids[index])

    def _expand(self, negative: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        per_value = torch.cat([scales, scales.new_zeros(1)]).index_select(0, ids)
        return torch.where(negative, -per_value, per_value)

