"""rotated-sign (codecs/rotsign.py): the fast Hadamard transform agrees with the matrix, the rotation is undone
exactly, the default code keeps each block's projection exact, and the mean over seeds converges to the input
(unbiased), where sign-block's does not."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.codecs import CodecError, get_codec
from geotrain.codecs.rotsign import hadamard, rotate, unrotate

PROPERTY = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sylvester(b: int) -> torch.Tensor:
    """The reference: the b x b Hadamard matrix built by Sylvester's doubling, H_2b = [[H, H], [H, -H]]."""
    matrix = torch.ones(1, 1, dtype=torch.float64)
    while matrix.shape[0] < b:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    return matrix


@pytest.mark.parametrize("b", [1, 2, 8, 128])
def test_the_fast_transform_equals_the_hadamard_matrix_and_the_rotation_is_undone(b):
    rows = torch.randn(5, b, generator=torch.Generator().manual_seed(b), dtype=torch.float64)
    assert torch.allclose(hadamard(rows), rows @ sylvester(b), atol=1e-12)
    rotated = rotate(rows, key=12345)
    assert torch.allclose(rotated.norm(dim=1), rows.norm(dim=1))  # orthogonal
    assert torch.allclose(unrotate(rotated, key=12345), rows, atol=1e-12)


@PROPERTY
@given(n=st.integers(1, 300), block=st.sampled_from([4, 32, 128]), seed=st.integers(0, 2**16))
def test_the_default_code_keeps_the_projection_on_the_input_exact(n, block, seed):
    """scale = |y|^2 / |y|_1 per block: the error is orthogonal to the input, <x', x> = |x|^2."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float()
    codec = get_codec("rotated-sign", block_size=block, seed=seed)
    decoded, nbytes = codec.roundtrip(x)
    assert nbytes == math.ceil(n / 8) + 4 * math.ceil(n / block) + 8
    assert float((decoded.double() * x.double()).sum()) == pytest.approx(float(x.double().norm() ** 2), rel=1e-4)


@pytest.mark.parametrize("name,params", [("rotated-sign", {}), ("rotated-sign", {"stochastic": True}),
                                         ("sign-block", {})])
def test_the_mean_over_seeds_converges_to_the_input(name, params):
    """N independent draws with per-draw error energy V average to an error of energy V / N when unbiased: the
    bound 4 V / N. A fixed code (sign-block, the same for every seed) keeps its error V, far above the bound."""
    x = torch.randn(96, 128, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.1, 3.0, 128)
    draws = 64
    decoded = [get_codec(name, **({"seed": s} if name == "rotated-sign" else {}), **params).roundtrip(x)[0].double()
               for s in range(draws)]
    energy = sum(float((d - x.double()).norm() ** 2) for d in decoded) / draws
    mean_error = float((torch.stack(decoded).mean(dim=0) - x.double()).norm() ** 2)
    holds = mean_error <= 4 * energy / draws
    assert holds == (name == "rotated-sign"), (mean_error, energy / draws)


def test_every_call_rotates_anew_but_the_same_input_gives_the_same_payload():
    codec = get_codec("rotated-sign")
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(1))
    a, b = codec.encode(x), codec.encode(x.clone())
    assert torch.equal(a.buffers["key"], b.buffers["key"]) and torch.equal(a.buffers["bits"], b.buffers["bits"])
    assert not torch.equal(codec.encode(x * 1.5).buffers["key"], a.buffers["key"])


def test_a_block_size_that_is_not_a_power_of_two_is_refused():
    with pytest.raises(CodecError, match="block_size must be a power of two, got 96"):
        get_codec("rotated-sign", block_size=96)


def test_clip_caps_the_stochastic_scale_and_needs_stochastic():
    x = torch.randn(8, 128, generator=torch.Generator().manual_seed(2))
    capped = get_codec("rotated-sign", stochastic=True, clip=2.0).encode(x).buffers["scales"]
    full = get_codec("rotated-sign", stochastic=True).encode(x).buffers["scales"]
    assert bool((capped < full).all()) and bool((capped <= 2.0 * x.norm(dim=1) / math.sqrt(128) + 1e-5).all())
    with pytest.raises(CodecError, match="clip=2.0 needs stochastic=true"):
        get_codec("rotated-sign", clip=2.0)
