"""log-block: sign exact, zeros exact, every non-zero value within its block's relative bound, the
wire size, NaN handling; against a plain numpy reference of the levels (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.codecs import CodecError, NonFiniteGradientError, get_codec

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

magnitudes = st.floats(min_value=2.0 ** -100, max_value=2.0 ** 100, allow_nan=False, allow_infinity=False, width=32)
values = st.one_of(st.just(0.0), magnitudes, magnitudes.map(lambda v: -v))


def reference(x: np.ndarray, bits: int, block: int) -> np.ndarray:
    """The module doc's levels, in float64: nearest log level per non-zero value, sign kept."""
    levels = (1 << (bits - 1)) - 1
    out = np.zeros_like(x, dtype=np.float64)
    for start in range(0, x.size, block):
        chunk = x[start:start + block].astype(np.float64)
        nonzero = chunk != 0
        if not nonzero.any():
            continue
        logs = np.log(np.abs(chunk[nonzero]))
        lo, hi = logs.min(), logs.max()
        step = (hi - lo) / (levels - 1)
        k = np.zeros_like(logs) if step == 0 else np.clip(np.ceil((logs - lo) / step - 0.5), 0, levels - 1)
        piece = np.zeros_like(chunk)
        piece[nonzero] = np.sign(chunk[nonzero]) * np.exp(lo + k * step)
        out[start:start + block] = piece
    return out


@PROPERTY
@given(st.lists(values, max_size=300), st.sampled_from([4, 8]), st.integers(1, 70))
def test_sign_zeros_and_relative_bound(xs, bits, block):
    x = torch.tensor(xs, dtype=torch.float32)
    codec = get_codec("log-block", bits=bits, block_size=block)
    decoded, nbytes = codec.roundtrip(x)
    assert nbytes == math.ceil(len(xs) * bits / 8) + 8 * math.ceil(len(xs) / block)
    assert torch.equal(decoded == 0, x == 0)
    assert torch.equal(torch.sign(decoded), torch.sign(x))
    levels = (1 << (bits - 1)) - 1
    for start in range(0, len(xs), block):
        chunk, got = x[start:start + block].double(), decoded[start:start + block].double()
        nonzero = chunk != 0
        if not bool(nonzero.any()):
            continue
        logs = chunk[nonzero].abs().log()
        bound = float(logs.max() - logs.min()) / (2 * (levels - 1)) + 1e-5 * (1 + float(logs.abs().max()))
        assert float((got[nonzero].abs().log() - logs).abs().max()) <= bound


@PROPERTY
@given(st.lists(values, max_size=200), st.sampled_from([4, 8]), st.integers(1, 40))
def test_matches_the_numpy_reference(xs, bits, block):
    x = np.asarray(xs, dtype=np.float32)
    decoded = get_codec("log-block", bits=bits, block_size=block).roundtrip(torch.from_numpy(x))[0].double().numpy()
    expected = reference(x, bits, block)
    # levels equal up to fp32 rounding of the bounds and the exponent (ties may round either way)
    np.testing.assert_allclose(decoded, expected, rtol=2e-3 if bits == 8 else 1e-3, atol=0)


def test_a_second_moment_keeps_its_small_values():
    """What int8-block cannot: a block spanning ten decades keeps every value within a factor."""
    v = torch.logspace(-14, -4, 128)
    decoded = get_codec("log-block").roundtrip(v)[0]
    ratio = decoded / v
    assert float(ratio.min()) > 0.1 and float(ratio.max()) < 10  # 7 levels over 23 nats: a factor < e^1.92
    int8 = get_codec("int8-block").roundtrip(v)[0]
    assert int(torch.count_nonzero(int8 == 0)) > 90  # blockwise int8 zeroes most of them


def test_nonfinite_refused_or_sent_as_nan():
    x = torch.tensor([1.0, float("nan"), 3.0] + [2.0] * 200)
    with pytest.raises(NonFiniteGradientError):
        get_codec("log-block").encode(x)
    decoded = get_codec("log-block", allow_nonfinite=True, block_size=100).roundtrip(x)[0]
    assert bool(decoded[:100].isnan().all()) and bool(torch.isfinite(decoded[100:]).all())


@pytest.mark.parametrize("bits", [4, 8])
def test_values_at_fp32_edges_decode_finite_and_non_zero(bits):
    """lo/hi are logs rounded to fp32: exp(hi) of fp32's largest value can round past it (CI found
    3.4028116e38 decoding to inf); the smallest subnormal's exp(lo) can round to zero."""
    edge = np.finfo(np.float32)
    x = torch.tensor([float(edge.max), 3.4028116e38, -float(edge.max), float(edge.smallest_subnormal),
                      -float(edge.smallest_subnormal), 1.0], dtype=torch.float32)
    for block in (1, 2, 6):
        decoded = get_codec("log-block", bits=bits, block_size=block).roundtrip(x)[0]
        assert bool(torch.isfinite(decoded).all()), (block, decoded)
        assert torch.equal(torch.sign(decoded), torch.sign(x)), (block, decoded)
    single = get_codec("log-block", bits=bits, block_size=1).roundtrip(x)[0]
    assert torch.allclose(single[:3].double(), x[:3].double(), rtol=2e-5)  # log rounded to fp32: 89 x 2^-24


def test_finite_float64_beyond_fp32_is_a_codec_error():
    with pytest.raises(CodecError, match="overflows"):
        get_codec("log-block").encode(torch.tensor([1e300, 1.0], dtype=torch.float64))


def test_bad_parameters_and_payloads():
    with pytest.raises(CodecError, match="bits"):
        get_codec("log-block", bits=3)
    with pytest.raises(CodecError, match="block_size"):
        get_codec("log-block", block_size=0)
    payload = get_codec("log-block", bits=8).encode(torch.ones(10))
    with pytest.raises(CodecError):
        get_codec("log-block", bits=4).decode(payload)
