"""Fresh output buffers for codecs, allocated through numpy.

numpy asks the kernel for transparent huge pages on large arrays (madvise), so filling a fresh 40 MB
buffer takes ~512x fewer page faults than with torch's CPU allocator; on the machines we measured
that made decoding 1e7 values 3-5x faster. The tensors are ordinary CPU tensors that own their memory.
"""

from __future__ import annotations

import numpy as np
import torch

_NUMPY_DTYPES = {
    torch.float64: np.float64,
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.bfloat16: np.int16,  # numpy has no bfloat16: same item size, viewed back below
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
}


def new_buffer(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised 1-D tensor of `numel` values of `dtype`."""
    if dtype not in _NUMPY_DTYPES:
        return torch.empty(numel, dtype=dtype)
    tensor = torch.from_numpy(np.empty(numel, dtype=_NUMPY_DTYPES[dtype]))
    return tensor.view(dtype) if dtype == torch.bfloat16 else tensor


def new_zeros(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of `numel` zeros of `dtype` (zero pages from the kernel, touched lazily)."""
    if dtype not in _NUMPY_DTYPES:
        return torch.zeros(numel, dtype=dtype)
    tensor = torch.from_numpy(np.zeros(numel, dtype=_NUMPY_DTYPES[dtype]))
    return tensor.view(dtype) if dtype == torch.bfloat16 else tensor


def converted(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A flat copy of `tensor` as `dtype`, in a fresh buffer (never aliasing the input)."""
    out = new_buffer(tensor.numel(), dtype)
    if tensor.numel():
        out.copy_(tensor.reshape(-1))
    return out
