"""Float dtypes by the names users write (`fp32`, `fp16`, `bf16`): the one table of them.

Codec parameters (topk's `value_dtype`) and the hierarchical all-reduce's `intra_dtype` read names
through `float_dtype`; a codec's own wire dtype is its `wire_float_dtype` fact, not a name.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from geotrain.codecs.base import CodecError

FLOAT_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def float_dtype(name: str, source: str, allowed: Iterable[str] = tuple(FLOAT_DTYPES)) -> torch.dtype:
    """The torch dtype of `name`; CodecError naming `source` and the `allowed` names otherwise."""
    allowed = tuple(allowed)
    if not isinstance(name, str) or name not in allowed:
        raise CodecError(f"{source} must be one of {', '.join(allowed)}, got {name!r}")
    return FLOAT_DTYPES[name]


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per value of `dtype`."""
    return torch.empty((), dtype=dtype).element_size()
