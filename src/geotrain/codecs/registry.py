"""Codecs by name: `get_codec("topk", fraction=0.01)`."""

from __future__ import annotations

import inspect
from typing import Any

from geotrain.codecs.base import Codec, CodecError
from geotrain.codecs.cast import Bf16Codec, Fp16Codec, NoneCodec
from geotrain.codecs.logblock import LogBlockCodec
from geotrain.codecs.lowbit import Fp4BlockCodec, Int2BlockCodec, Int4BlockCodec
from geotrain.codecs.powersgd import PowerSGDCodec
from geotrain.codecs.quantize import Int8BlockCodec, Int8Codec
from geotrain.codecs.rotsign import RotatedSignCodec
from geotrain.codecs.rotternary import RotatedTernaryCodec
from geotrain.codecs.sign import SignCodec
from geotrain.codecs.signblock import SignBlockCodec
from geotrain.codecs.sparse import RandKCodec, TopKCodec
from geotrain.codecs.sparse_lowbit import TopKLowBitCodec

CODECS: dict[str, type[Codec]] = {
    codec.name: codec
    for codec in (NoneCodec, Fp16Codec, Bf16Codec, Int8Codec, Int8BlockCodec, TopKCodec, RandKCodec,
                  SignCodec, PowerSGDCodec, Int4BlockCodec, Fp4BlockCodec, Int2BlockCodec, TopKLowBitCodec,
                  LogBlockCodec, SignBlockCodec, RotatedSignCodec, RotatedTernaryCodec)
}


def codec_params(name: str) -> dict[str, Any]:
    """The parameters codec `name` accepts, with their defaults."""
    cls = _codec_class(name)
    signature = inspect.signature(cls.__init__)
    return {param.name: param.default for param in signature.parameters.values()
            if param.kind is inspect.Parameter.KEYWORD_ONLY}


def get_codec(name: str, **params: Any) -> Codec:
    """A new codec `name` built with `params`; CodecError names the allowed names or parameters."""
    cls = _codec_class(name)
    allowed = codec_params(name)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        listing = ", ".join(f"{key}={value!r}" for key, value in allowed.items())
        raise CodecError(f"codec {name!r} has no parameter(s) {', '.join(unknown)} (allowed: {listing})")
    return cls(**params)


def _codec_class(name: str) -> type[Codec]:
    if name not in CODECS:
        raise CodecError(f"unknown codec {name!r} (known: {', '.join(CODECS)})")
    return CODECS[name]
