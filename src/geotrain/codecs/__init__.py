"""Gradient/activation codecs: a registry by name, one contract (encode -> Payload -> decode), error feedback."""

from geotrain.codecs.base import (
    BufferSpec,
    Codec,
    CodecError,
    CodecTypeError,
    NonFiniteGradientError,
    Payload,
    PayloadSpec,
    parse_count,
    parse_flag,
)
from geotrain.codecs.cast import Bf16Codec, Fp16Codec, NoneCodec
from geotrain.codecs.feedback import ErrorFeedback, ErrorFeedbackBank
from geotrain.codecs.logblock import LogBlockCodec
from geotrain.codecs.lowbit import Fp4BlockCodec, Int2BlockCodec, Int4BlockCodec, pack_codes, unpack_codes
from geotrain.codecs.powersgd import PowerSGDCodec
from geotrain.codecs.quantize import Int8BlockCodec, Int8Codec
from geotrain.codecs.rotsign import RotatedSignCodec
from geotrain.codecs.rotternary import RotatedTernaryCodec
from geotrain.codecs.registry import CODECS, codec_params, get_codec
from geotrain.codecs.selection import approx_topk_indices, random_k_indices, topk_indices
from geotrain.codecs.spec import CodecSpec, parse_codec_spec
from geotrain.codecs.sign import SignCodec, pack_sign_bits, unpack_sign_bits
from geotrain.codecs.sparse import RandKCodec, TopKCodec
from geotrain.codecs.sparse_lowbit import TopKLowBitCodec
from geotrain.codecs.wire import pack_payload, payload_spec, unpack_payload

__all__ = [
    "CODECS",
    "Bf16Codec",
    "BufferSpec",
    "Codec",
    "CodecError",
    "CodecSpec",
    "CodecTypeError",
    "ErrorFeedback",
    "ErrorFeedbackBank",
    "Fp16Codec",
    "Fp4BlockCodec",
    "Int2BlockCodec",
    "Int4BlockCodec",
    "Int8BlockCodec",
    "Int8Codec",
    "LogBlockCodec",
    "NonFiniteGradientError",
    "NoneCodec",
    "Payload",
    "PayloadSpec",
    "PowerSGDCodec",
    "RandKCodec",
    "RotatedSignCodec",
    "RotatedTernaryCodec",
    "SignCodec",
    "TopKCodec",
    "TopKLowBitCodec",
    "approx_topk_indices",
    "codec_params",
    "get_codec",
    "pack_codes",
    "pack_payload",
    "pack_sign_bits",
    "parse_codec_spec",
    "parse_count",
    "parse_flag",
    "payload_spec",
    "random_k_indices",
    "topk_indices",
    "unpack_codes",
    "unpack_payload",
    "unpack_sign_bits",
]
