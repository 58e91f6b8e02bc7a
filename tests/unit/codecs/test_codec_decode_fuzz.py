"""Fuzz every registered codec's decode (and unpack_payload) with mutated real payloads (hypothesis).

Contract: decode of any object gives a tensor of the payload's shape and dtype, or CodecError, never
another exception; it never allocates for a shape beyond MAX_DECODE_NUMEL values. The mutations: cut
and extended buffers, wrong dtypes, missing/extra/renamed buffers, non-tensors, shapes and metadata
with negative, huge, NaN, float, string and None values, wrong codec names and dtypes, topk indices
out of range, and packed bytes with a cut, extended or corrupted spec.

Mutated shapes are either small (at most 2**18 values) or invalid, so a fuzz run stays within a
few MB; `test_a_shape_claiming_1e12_values_is_refused_before_allocating` covers huge claims.
GEOTRAIN_FUZZ_EXAMPLES (default 40; the suite runs the default, set it higher for a deeper search) sets the examples per codec variant and test.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.codecs import (
    CODECS,
    BufferSpec,
    CodecError,
    Payload,
    PayloadSpec,
    get_codec,
    pack_payload,
    unpack_payload,
)
from geotrain.codecs.base import MAX_DECODE_NUMEL

EXAMPLES = int(os.environ.get("GEOTRAIN_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

VARIANTS: list[tuple[str, dict]] = [(name, {}) for name in CODECS] + [
    ("int8-block", {"block_size": 4}),
    ("topk", {"fraction": 0.3, "value_dtype": "fp16"}),
    ("randk", {"fraction": 0.3, "seed": 3}),
    ("powersgd", {"rank": 2}),
]
IDS = [name + "".join(f"-{k}={v}" for k, v in params.items()) for name, params in VARIANTS]

EVIL_NUMBERS = [-1, -(2**31), 0, 1, 2**31, 2**32 + 1, 10**12, 2**63, 2**70, 1.5, -0.0, float("nan"),
                float("inf"), True, None, "3", "", [1], {"a": 1}, np.int64(-5), np.float32(2.0), 1 + 2j]
EVIL = st.sampled_from(EVIL_NUMBERS) | st.integers(-(2**80), 2**80)
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
                          torch.int32, torch.int64, torch.bool, torch.complex64])


def small_shapes(max_dims: int = 3) -> st.SearchStrategy[tuple[int, ...]]:
    """Valid shapes of at most 64**3 = 2**18 values."""
    return st.lists(st.integers(0, 64), min_size=0, max_size=max_dims).map(tuple)


def tensors() -> st.SearchStrategy[torch.Tensor]:
    """Real inputs: fp32/fp64/fp16 tensors of small shapes, finite values."""
    return st.builds(_input, small_shapes(2).filter(lambda s: math.prod(s) <= 4096), st.integers(0, 2**16),
                     st.sampled_from([torch.float32, torch.float64, torch.float16]))


def _input(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 10).to(dtype)


def _retyped(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if t.is_complex():
        t = t.real
    return t.to(dtype) if dtype != torch.complex64 else t.to(torch.float32).to(dtype)


# A mutation takes (payload, draw) and returns the object handed to decode.
def _mutate_buffer(payload: Payload, draw) -> Payload:
    buffers = {key: value for key, value in payload.buffers.items() if isinstance(key, str)}
    tensors = sorted(name for name, t in buffers.items() if isinstance(t, torch.Tensor) and not t.is_sparse)
    if not tensors:
        return payload
    name = draw(st.sampled_from(tensors))
    t = buffers[name]
    how = draw(st.sampled_from(["cut", "extend", "dtype", "reshape", "drop", "extra", "rename", "object",
                                "values", "noncontiguous", "requires_grad"]))
    if how == "cut":
        buffers[name] = t.reshape(-1)[: draw(st.integers(0, max(0, t.numel() - 1)))]
    elif how == "extend":
        buffers[name] = torch.cat([t.reshape(-1), t.reshape(-1)[:1].repeat(draw(st.integers(1, 9)))
                                   if t.numel() else torch.zeros(draw(st.integers(1, 9)), dtype=t.dtype)])
    elif how == "dtype":
        buffers[name] = _retyped(t, draw(DTYPES))
    elif how == "reshape":
        buffers[name] = t.reshape(1, -1) if t.numel() else t.reshape(0, 1)
    elif how == "drop":
        del buffers[name]
    elif how == "extra":
        buffers[draw(st.sampled_from(["extra", "values", "scales", "indices", "p", 7]))] = torch.zeros(3)
    elif how == "rename":
        buffers[name + "_"] = buffers.pop(name)
    elif how == "object":
        sparse = t.to_sparse() if t.dim() else None
        buffers[name] = draw(st.sampled_from([None, [1.0, 2.0], np.zeros(t.shape, dtype=np.float32), "bytes", sparse]))
    elif how == "values":  # random contents of the right dtype and length (indices out of range...)
        raw = draw(st.binary(min_size=t.numel() * t.element_size(), max_size=t.numel() * t.element_size()))
        buffers[name] = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(t.dtype).reshape(t.shape) \
            if raw else t.clone()
    elif how == "noncontiguous":
        buffers[name] = torch.stack([t.reshape(-1), t.reshape(-1)], dim=1)[:, 0].reshape(t.shape)
    else:
        buffers[name] = t.clone().to(torch.float32).requires_grad_(True).to(t.dtype) \
            if t.is_floating_point() else t
    return dataclasses.replace(payload, buffers=buffers)


def _mutate_shape(payload: Payload, draw) -> Payload:
    how = draw(st.sampled_from(["small", "evil", "object"]))
    if how == "small":
        shape = draw(small_shapes())
    elif how == "evil":
        shape = list(draw(small_shapes()))
        shape.insert(draw(st.integers(0, len(shape))), draw(EVIL))
        shape = tuple(shape)
    else:
        shape = draw(st.sampled_from([None, 5, "3,4", (2.0, 3), [2, 3], torch.Size([2, 3]), (1,) * 65,
                                      np.array([2, 3]), (np.int64(2), np.int64(3))]))
    return dataclasses.replace(payload, shape=shape)


def _mutate_meta(payload: Payload, draw) -> Payload:
    meta = dict(payload.meta)
    key = draw(st.sampled_from(sorted(set(meta) | {"k", "step", "seed", "block_size", "rank"})))
    if draw(st.booleans()) and key in meta:
        del meta[key]
    else:
        meta[key] = draw(EVIL)
    return dataclasses.replace(payload, meta=meta)


def _mutate_header(payload: Payload, draw) -> object:
    how = draw(st.sampled_from(["codec", "dtype", "meta", "buffers", "object"]))
    if how == "codec":
        return dataclasses.replace(payload, codec=draw(st.sampled_from(["", "topk", "fp16", None, 3, list(CODECS)])))
    if how == "dtype":
        return dataclasses.replace(payload, dtype=draw(DTYPES | st.sampled_from([None, "float32", np.float32])))
    if how == "meta":
        return dataclasses.replace(payload, meta=draw(st.sampled_from([None, [], "k=1", {1: 2}])))
    if how == "buffers":
        return dataclasses.replace(payload, buffers=draw(st.sampled_from([None, [], list(payload.buffers.values())])))
    spec = PayloadSpec(payload.codec, (1,), torch.float32, ())
    return draw(st.sampled_from([None, {}, payload.buffers, spec, "payload"]))


MUTATIONS = [_mutate_buffer, _mutate_shape, _mutate_meta]


def decode_or_codec_error(codec, candidate) -> torch.Tensor | None:
    """decode(candidate): the tensor, or None on CodecError; any other exception fails the test."""
    try:
        restored = codec.decode(candidate)
    except CodecError:
        return None
    assert isinstance(restored, torch.Tensor)
    assert tuple(restored.shape) == tuple(int(d) for d in candidate.shape) and restored.dtype == candidate.dtype
    assert restored.numel() <= MAX_DECODE_NUMEL
    return restored


@pytest.mark.parametrize("name,params", VARIANTS, ids=IDS)
@FUZZ
@given(x=tensors(), data=st.data())
def test_decode_of_a_mutated_payload_gives_a_tensor_or_codec_error(name, params, x, data):
    codec = get_codec(name, **params)
    payload = codec.encode(x)
    candidate = payload
    for _ in range(data.draw(st.integers(1, 3))):
        candidate = data.draw(st.sampled_from(MUTATIONS))(candidate, data.draw)
    if data.draw(st.integers(0, 3)) == 0:  # a broken header last (the mutations above need a sound one)
        candidate = _mutate_header(candidate, data.draw)
    decode_or_codec_error(codec, candidate)


@pytest.mark.parametrize("name,params", VARIANTS, ids=IDS)
@FUZZ
@given(x=tensors(), data=st.data())
def test_unpack_then_decode_of_mutated_bytes_or_spec_gives_a_tensor_or_codec_error(name, params, x, data):
    codec = get_codec(name, **params)
    payload = codec.encode(x)
    packed, spec = pack_payload(payload), payload.spec()
    how = data.draw(st.sampled_from(["cut", "extend", "flip", "spec-buffer", "spec-shape", "spec-meta", "dtype"]))
    if how == "cut":
        packed = packed[: data.draw(st.integers(0, max(0, packed.numel() - 1)))]
    elif how == "extend":
        packed = torch.cat([packed, torch.zeros(data.draw(st.integers(1, 16)), dtype=torch.uint8)])
    elif how == "flip" and packed.numel():
        packed = packed.clone()
        packed[data.draw(st.integers(0, packed.numel() - 1))] ^= data.draw(st.integers(1, 255))
    elif how == "spec-buffer" and spec.buffers:
        index = data.draw(st.integers(0, len(spec.buffers) - 1))
        old = spec.buffers[index]
        new = BufferSpec(data.draw(st.sampled_from([old.name, "x", spec.buffers[0].name])),
                         data.draw(DTYPES | st.sampled_from([None, "int8"])),
                         data.draw(st.sampled_from([old.shape, (), (-1,), (2**40,), (1.5,), None, (old.shape, 1)])))
        spec = dataclasses.replace(spec, buffers=spec.buffers[:index] + (new,) + spec.buffers[index + 1:])
    elif how == "spec-shape":
        spec = dataclasses.replace(spec, shape=_mutate_shape(payload, data.draw).shape)
    elif how == "spec-meta":
        spec = dataclasses.replace(spec, meta=_mutate_meta(payload, data.draw).meta)
    elif how == "dtype":
        packed = _retyped(packed, data.draw(DTYPES))
    try:
        candidate = unpack_payload(packed, spec)
    except CodecError:
        return
    decode_or_codec_error(codec, candidate)


@pytest.mark.parametrize("name,params", VARIANTS, ids=IDS)
def test_an_unmutated_payload_still_decodes_exactly_as_before(name, params):
    codec = get_codec(name, **params)
    x = _input((6, 10), 1, torch.float32)
    payload = codec.encode(x)
    restored = decode_or_codec_error(codec, payload)
    assert restored is not None and torch.equal(restored, codec._decode(payload))


@pytest.mark.parametrize("name,params", VARIANTS, ids=IDS)
@pytest.mark.parametrize("shape", [(10**6, 10**6), (2**31,), (2**16, 2**16, 2), (-1, -1), (2**64, 0)])
def test_a_shape_claiming_1e12_values_is_refused_before_allocating(name, params, shape):
    codec = get_codec(name, **params)
    payload = codec.encode(torch.ones(1, 1))
    with pytest.raises(CodecError, match="payload shape"):
        codec.decode(dataclasses.replace(payload, shape=shape))
