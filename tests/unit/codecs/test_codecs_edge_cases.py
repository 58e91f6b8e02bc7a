"""Codec edge cases: zeros, empty tensors, k > n, wrong types, NaN/inf, bad names/params, bad payloads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geotrain.codecs import (
    CODECS,
    CodecError,
    CodecTypeError,
    ErrorFeedback,
    ErrorFeedbackBank,
    NonFiniteGradientError,
    codec_params,
    get_codec,
    pack_payload,
    unpack_payload,
)
from geotrain.errors import GeotrainError

ALL = sorted(CODECS)
SHAPES = [(0,), (0, 3), (), (1,), (5,), (3, 4), (2, 3, 5), (300,), (40, 70)]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("shape", SHAPES)
def test_all_zero_input_decodes_to_zeros_with_documented_bytes(name, shape):
    codec = get_codec(name)
    zeros = torch.zeros(shape)
    payload = codec.encode(zeros)
    restored = codec.decode(payload)
    assert restored.shape == zeros.shape and restored.dtype == zeros.dtype
    assert torch.equal(restored, zeros)
    assert not torch.isnan(restored).any()
    assert payload.nbytes == codec.wire_nbytes(shape)


@pytest.mark.parametrize("name", ALL)
def test_empty_tensor_round_trips_and_packs(name):
    codec = get_codec(name)
    empty = torch.empty(0, 7, dtype=torch.bfloat16)
    payload = codec.encode(empty)
    assert codec.decode(payload).shape == (0, 7)
    data = pack_payload(payload)
    assert data.numel() == payload.nbytes
    assert codec.decode(unpack_payload(data, payload.spec())).dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["topk", "randk"])
@pytest.mark.parametrize("n", [1, 2, 7])
def test_sparse_k_never_exceeds_n(name, n):
    codec = get_codec(name, fraction=1.0)
    x = torch.arange(1.0, n + 1.0)
    payload = codec.encode(x)
    assert payload.meta["k"] == n
    assert torch.equal(codec.decode(payload), x)  # k == n: lossless
    small = get_codec(name, fraction=0.001)
    assert small.encode(x).meta["k"] == 1  # at least one value even when fraction * n < 1


@pytest.mark.parametrize("selection", ["threshold", "sort"])
def test_topk_with_k_equal_n_is_lossless(selection):
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(3))
    codec = get_codec("topk", fraction=1.0, selection=selection)
    assert torch.equal(codec.decode(codec.encode(x)), x)


def test_topk_rejects_an_unknown_selection():
    with pytest.raises(CodecError, match="selection must be one of threshold, sort"):
        get_codec("topk", selection="approximate")


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [torch.arange(6), torch.ones(3, dtype=torch.bool), torch.ones(2, dtype=torch.complex64)])
def test_non_float_input_raises_a_clear_type_error(name, bad):
    codec = get_codec(name)
    with pytest.raises(TypeError, match="floating-point") as info:
        codec.encode(bad)
    assert isinstance(info.value, CodecTypeError) and isinstance(info.value, GeotrainError)


@pytest.mark.parametrize("name", ALL)
def test_non_tensor_input_raises_type_error(name):
    with pytest.raises(CodecTypeError, match="torch tensors"):
        get_codec(name).encode([1.0, 2.0])


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_raises_by_default(name, bad_value):
    x = torch.randn(8, 300)
    x[3, 17] = bad_value
    with pytest.raises(NonFiniteGradientError, match="1 NaN/inf"):
        get_codec(name).encode(x)


@pytest.mark.parametrize("name", ["none", "fp16", "bf16"])
def test_cast_codecs_pass_non_finite_values_through_when_allowed(name):
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -2.0])
    restored = get_codec(name, allow_nonfinite=True).roundtrip(x)[0]
    assert torch.isnan(restored[1]) and restored[2] == float("inf") and restored[3] == -float("inf")
    assert restored[0] == 1.0 and restored[4] == -2.0


@pytest.mark.parametrize("name", ["int8", "int8-block", "sign", "powersgd"])
def test_scaled_codecs_poison_the_group_when_non_finite_allowed(name):
    x = torch.randn(64)
    x[5] = float("nan")
    restored = get_codec(name, allow_nonfinite=True).roundtrip(x)[0]
    assert not torch.isfinite(restored).all()  # the receiver's own inf check still sees it


def test_int8_block_non_finite_only_poisons_its_own_block():
    x = torch.randn(1024)
    x[700] = float("inf")
    restored = get_codec("int8-block", block_size=256, allow_nonfinite=True).roundtrip(x)[0]
    assert torch.isfinite(restored[:512]).all() and torch.isfinite(restored[768:]).all()
    assert not torch.isfinite(restored[512:768]).all()


def test_topk_keeps_nan_when_allowed():
    x = torch.zeros(100)
    x[42] = float("nan")
    restored = get_codec("topk", fraction=0.01, allow_nonfinite=True).roundtrip(x)[0]
    assert torch.isnan(restored[42])


@pytest.mark.parametrize("name,value", [("fp16", 1e5), ("fp16", -7e4), ("bf16", 3.4e38)])
def test_finite_values_beyond_the_wire_range_raise_codec_error(name, value):
    x = torch.tensor([1.0, value])
    with pytest.raises(CodecError, match="overflows the wire format"):
        get_codec(name).encode(x)


def test_float64_beyond_float32_range_raises_for_scaled_codecs():
    x = torch.tensor([1.0, 1e300], dtype=torch.float64)
    for name in ("none", "int8", "int8-block", "sign"):
        with pytest.raises(CodecError, match="overflows"):
            get_codec(name).encode(x)


def test_huge_finite_fp32_sum_is_not_mistaken_for_non_finite():
    x = torch.full((1000,), 3e38)
    for name in ("none", "topk", "randk"):
        assert torch.equal(get_codec(name, **({"fraction": 1.0} if name != "none" else {})).roundtrip(x)[0], x)


def test_unknown_codec_lists_the_known_names():
    with pytest.raises(CodecError, match="unknown codec 'fp8'.*known: none, fp16, bf16, int8, int8-block"):
        get_codec("fp8")


@pytest.mark.parametrize("name,params,message", [
    ("topk", {"frac": 0.1}, r"no parameter\(s\) frac \(allowed: fraction=0.01"),
    ("fp16", {"block_size": 4}, r"allowed: allow_nonfinite=False"),
    ("topk", {"fraction": 0.0}, r"fraction must be a number in \(0, 1\], got 0.0"),
    ("topk", {"fraction": 1.5}, r"got 1.5"),
    ("randk", {"fraction": "a"}, r"got 'a'"),
    ("topk", {"value_dtype": "int8"}, r"value_dtype must be one of \['fp16', 'fp32'\]"),
    ("int8-block", {"block_size": 0}, r"block_size must be an integer >= 1, got 0"),
    ("int8-block", {"block_size": 2.5}, r"got 2.5"),
    ("powersgd", {"rank": 0}, r"rank must be an integer >= 1"),
    ("powersgd", {"power_iterations": 0}, r"power_iterations must be an integer >= 1, got 0"),
    ("randk", {"seed": -1}, r"seed must be an integer >= 0"),
])
def test_bad_parameters_raise_codec_error_naming_allowed_values(name, params, message):
    with pytest.raises(CodecError, match=message):
        get_codec(name, **params)


def test_every_codec_accepts_allow_nonfinite():
    for name in CODECS:
        assert "allow_nonfinite" in codec_params(name)
        assert get_codec(name, allow_nonfinite=True).allow_nonfinite


def test_decode_rejects_another_codecs_payload():
    payload = get_codec("fp16").encode(torch.ones(4))
    with pytest.raises(CodecError, match="cannot decode a 'fp16' payload"):
        get_codec("bf16").decode(payload)


def test_unpack_rejects_wrong_length_and_dtype():
    payload = get_codec("int8").encode(torch.randn(10))
    data = pack_payload(payload)
    with pytest.raises(CodecError, match="has 13 bytes, its spec says 14"):
        unpack_payload(data[:-1], payload.spec())
    with pytest.raises(CodecError, match="1-D uint8"):
        unpack_payload(data.to(torch.int16), payload.spec())


@pytest.mark.parametrize("step", [-1, 1.7, 3.0, "3", True, None])
def test_set_step_rejects_anything_but_an_integer_at_least_zero(step):
    codec = get_codec("randk")
    codec.set_step(5)
    with pytest.raises(CodecError, match=r"codec 'randk': step must be an integer >= 0, got"):
        codec.set_step(step)
    assert codec.step == 5  # refused, not coerced


def test_set_step_takes_numpy_integers():
    codec = get_codec("randk")
    codec.set_step(np.int64(7))
    assert codec.step == 7 and type(codec.step) is int


def test_error_feedback_rejects_a_changed_shape():
    ef = ErrorFeedback(get_codec("topk"))
    ef.encode(torch.randn(10))
    with pytest.raises(CodecError, match="one ErrorFeedback per tensor stream"):
        ef.encode(torch.randn(11))


def test_error_feedback_keeps_its_residual_when_the_codec_refuses_the_input():
    ef = ErrorFeedback(get_codec("sign"))
    ef.encode(torch.randn(50))
    before = ef.residual.clone()
    bad = torch.randn(50)
    bad[0] = float("nan")
    with pytest.raises(NonFiniteGradientError):
        ef.encode(bad)
    assert torch.equal(ef.residual, before)
    with pytest.raises(CodecTypeError):
        ef.encode(torch.ones(50, dtype=torch.int32))


def test_error_feedback_state_for_another_codec_is_refused():
    ef = ErrorFeedback(get_codec("topk"))
    with pytest.raises(CodecError, match="for codec 'sign', not 'topk'"):
        ef.load_state_dict({"codec": "sign", "residual": None})
    with pytest.raises(CodecError, match="wraps a Codec"):
        ErrorFeedback("topk")


def test_error_feedback_reset_and_bank_keys():
    bank = ErrorFeedbackBank(get_codec("int8"))
    bank.encode("layer.weight", torch.randn(3, 4))
    bank.encode(7, torch.randn(5))
    assert sorted(map(str, bank.keys())) == ["7", "layer.weight"] and len(bank) == 2
    assert bank["layer.weight"].residual.shape == (3, 4)
    bank["layer.weight"].reset()
    assert bank["layer.weight"].residual is None
    bank.reset()
    assert len(bank) == 0


@pytest.mark.parametrize("name", ALL)
def test_decode_never_aliases_the_payload_or_encode_the_input(name):
    x = torch.randn(4, 3)
    original = x.clone()
    codec = get_codec(name, **({"fraction": 1.0} if name in ("topk", "randk") else {}))
    payload = codec.encode(x)
    restored = codec.decode(payload)
    restored.add_(1000.0)
    x.add_(-1000.0)
    assert torch.equal(codec.decode(payload), codec.decode(codec.encode(original)))
