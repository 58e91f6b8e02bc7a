"""`powersgd`: a rank-r approximation of matrix-shaped tensors by one power-iteration step
(Vogels et al., NeurIPS 2019), as a single-worker codec.

A tensor with ndim >= 2 is viewed as the matrix M (n x m, n = shape[0], m = the rest flattened).
With Q0 (m x r) drawn from a generator seeded by (seed, step, n, m):
    P = orthonormalise(M Q0)  (n x r),   Q = M^T P  (m x r),   decoded  M' = P Q^T.
`power_iterations` > 1 repeats P = orthonormalise(M M^T P) first (closer to the best rank-r fit, more
compute; a pipeline cut's per-sample gradients have no warm start; on bench pipeline's cut it trained worse).
Wire: P and Q in fp32, 4 r (n + m) bytes, r = min(rank, n, m). Vectors and scalars, and matrices
for which 4 r (n + m) >= 4 n m (low rank would not save bytes), are sent uncompressed in fp32.
Everything random depends only on (seed, step, shape), so the payload spec is fixed by the shape.

Difference from distributed PowerSGD (torch's powerSGD_hook): there every worker computes its P,
the P's are all-reduced (summed) before orthonormalisation, and Q = M^T P is computed from that
shared P and all-reduced too, so workers agree on one low-rank basis and Q0 is warm-started from
the previous step's Q. Here each worker's payload is a self-contained approximation of its own
gradient (decodable alone, combinable by decode-then-average), started from a fresh seeded Q0.
Use it with ErrorFeedback, as PowerSGD itself does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from geotrain.codecs.base import BufferSpec, Codec, CodecError, Payload, extremes, numel_of
from geotrain.codecs.buffers import converted, new_buffer
from geotrain.codecs.selection import seeded_generator


class PowerSGDCodec(Codec):
    """Low-rank P, Q factors for matrices; raw fp32 for everything else."""

    name = "powersgd"
    latency_rounds = 2.0

    def __init__(self, *, rank: int = 4, seed: int = 0, power_iterations: int = 1,
                 allow_nonfinite: bool = False) -> None:
        super().__init__(allow_nonfinite=allow_nonfinite)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise CodecError(f"powersgd: rank must be an integer >= 1, got {rank!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise CodecError(f"powersgd: seed must be an integer >= 0, got {seed!r}")
        if isinstance(power_iterations, bool) or not isinstance(power_iterations, int) or power_iterations < 1:
            raise CodecError(f"powersgd: power_iterations must be an integer >= 1, got {power_iterations!r}")
        self.rank = rank
        self.seed = seed
        self.power_iterations = power_iterations

    def params(self) -> dict[str, Any]:
        # power_iterations only when set: the data-parallel reducer (comm.powersgd, built from these params) runs one
        # and refuses the name, so a default codec's params stay what that reducer takes
        more = {"power_iterations": self.power_iterations} if self.power_iterations != 1 else {}
        return {"rank": self.rank, "seed": self.seed, **more, **super().params()}

    def matrix_rank(self, shape: tuple[int, ...]) -> int:
        """The rank used for `shape`, or 0 when the tensor is sent uncompressed (P, Q would not be smaller)."""
        return low_rank(shape, self.rank, 1.0)

    def encode(self, tensor: torch.Tensor) -> Payload:
        x = self._check_input(tensor)
        shape = tuple(tensor.shape)
        r = self.matrix_rank(shape)
        if r == 0:
            raw = converted(x, torch.float32)
            self._raise_if_nonfinite(x, extremes(raw), wire=raw)
            return Payload(self.name, {"raw": raw}, shape, tensor.dtype, {"rank": 0, "step": self.step})
        matrix = x.reshape(shape[0], -1).to(torch.float32)
        self._raise_if_nonfinite(x, extremes(matrix), wire=matrix)
        n, m = matrix.shape
        start = torch.randn(m, r, generator=seeded_generator(self.seed, self.step, n, m))
        p = orthonormal_columns(matrix @ start)
        for _ in range(self.power_iterations - 1):  # each further step: closer to the top-r singular subspace
            p = orthonormal_columns(matrix @ (matrix.T @ p))
        q = matrix.T @ p
        # Finite values near float32's limit can overflow the products (then P, Q hold inf/NaN).
        self._raise_if_nonfinite(x, extremes(q), wire=q)
        return Payload(self.name, {"p": p.contiguous(), "q": q.contiguous()}, shape, tensor.dtype,
                       {"rank": r, "step": self.step})

    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        """raw (n,) when meta rank is 0; else P (rows x r) and Q (cols x r), r <= min(rows, cols)."""
        shape = payload.shape
        self._meta_count(payload, "step", 0)
        if len(shape) < 2:
            rank = self._meta_count(payload, "rank", 0, maximum=0)
        else:
            rows, cols = shape[0], numel_of(shape[1:])
            rank = self._meta_count(payload, "rank", None, maximum=min(rows, cols))
        if rank == 0:
            return (BufferSpec("raw", torch.float32, (payload.numel,)),)
        return BufferSpec("p", torch.float32, (rows, rank)), BufferSpec("q", torch.float32, (cols, rank))

    def _decode(self, payload: Payload) -> torch.Tensor:
        if "raw" in payload.buffers:
            return converted(payload.buffers["raw"], payload.dtype).reshape(payload.shape)
        p, q = payload.buffers["p"], payload.buffers["q"]
        matrix = new_buffer(p.shape[0] * q.shape[0], torch.float32).view(p.shape[0], q.shape[0])
        torch.matmul(p, q.T, out=matrix)
        return matrix.to(payload.dtype).reshape(payload.shape)

    def bytes_per_value(self, hidden: int, trained_bytes: float) -> float:
        """On the dominant h x 4h MLP matrix: 4 r (h + 4h) / (4 h^2) bytes per value."""
        h = int(hidden)
        return self.wire_nbytes((h, 4 * h)) / (4 * h * h)

    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        r = self.matrix_rank(shape)
        if r == 0:
            return 4 * numel_of(shape)
        return 4 * r * (int(shape[0]) + numel_of(shape[1:]))


def low_rank(shape: Sequence[int], rank: int, min_compression_rate: float) -> int:
    """The one PowerSGD rank rule: r = min(rank, n, m) for a tensor of `shape` viewed as n x m
    (n = shape[0]), or 0 (send it uncompressed) for vectors and scalars and unless
    n m > min_compression_rate x r (n + m), i.e. unless P and Q are that many times smaller."""
    if len(shape) < 2:
        return 0
    n, m = int(shape[0]), math.prod(int(dim) for dim in shape[1:])
    r = min(rank, n, m)
    return r if r > 0 and n * m > min_compression_rate * r * (n + m) else 0


def orthonormal_columns(matrix: torch.Tensor) -> torch.Tensor:
    """An n x r matrix with orthonormal columns spanning `matrix`'s columns (reduced QR; zero input gives
    an arbitrary orthonormal basis, never NaN)."""
    q, _ = torch.linalg.qr(matrix, mode="reduced")
    return q
