"""rotated-ternary (codecs/rotternary.py): the projection on the input is exact, the mean over rotation seeds
converges to the input, the code leaves less noise than rotated-sign's 1-bit code, the trit packing inverts, and
settings that are no code are refused."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.codecs import CodecError, get_codec
from geotrain.codecs.rotternary import best_ternary, pack_trits, unpack_trits

PROPERTY = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(n=st.integers(1, 300), block=st.sampled_from([4, 32, 128]), seed=st.integers(0, 2**16))
def test_the_projection_on_the_input_is_exact(n, block, seed):
    """scale = |y|^2 / <y, t> per block: <x', x> = |x|^2, the error orthogonal to the input."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float()
    decoded, _ = get_codec("rotated-ternary", block_size=block, seed=seed).roundtrip(x)
    assert float((decoded.double() * x.double()).sum()) == pytest.approx(float(x.double().norm() ** 2), rel=1e-4)


def test_the_mean_over_seeds_converges_to_the_input():
    """N rotations with per-draw error energy V average to an error of energy about V / N (bound 4 V / N)."""
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.1, 3.0, 128)
    draws = 32
    decoded = [get_codec("rotated-ternary", seed=s).roundtrip(x)[0].double() for s in range(draws)]
    energy = sum(float((d - x.double()).norm() ** 2) for d in decoded) / draws
    assert float((torch.stack(decoded).mean(dim=0) - x.double()).norm() ** 2) <= 4 * energy / draws


def test_the_code_is_the_best_ternary_fit_and_leaves_less_noise_than_rotated_signs():
    """Every k (trits kept) fits a block worse than the chosen one; noise energy over |x|^2 on a Gaussian
    96 x 128 tensor ~0.23 against rotated-sign's ~0.57."""
    y = torch.randn(4, 64, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    chosen = best_ternary(y).double()
    def fit_error(t: torch.Tensor) -> torch.Tensor:
        return (y * y).sum(dim=1) - (y * t).sum(dim=1) ** 2 / (t * t).sum(dim=1)
    order = y.abs().argsort(dim=1, descending=True)
    for k in range(1, 65):
        kept = torch.zeros_like(y).scatter(1, order[:, :k], 1.0) * torch.sign(y)
        assert (fit_error(chosen) <= fit_error(kept) + 1e-9).all()
    x = torch.randn(96, 128, generator=torch.Generator().manual_seed(1))
    noise = {name: float((get_codec(name).roundtrip(x)[0] - x).norm() ** 2 / x.norm() ** 2)
             for name in ("rotated-ternary", "rotated-sign")}
    assert noise["rotated-ternary"] < 0.26 < 0.5 < noise["rotated-sign"], noise


@PROPERTY
@given(codes=st.lists(st.integers(0, 2), max_size=23))
def test_trits_pack_five_a_byte_and_unpack(codes):
    trits = torch.tensor(codes, dtype=torch.int64)
    packed = pack_trits(trits)
    assert packed.numel() == math.ceil(len(codes) / 5) and torch.equal(unpack_trits(packed, len(codes)), trits)


@pytest.mark.parametrize("params,message", [
    ({"block_size": 96}, "block_size must be a power of two, got 96"),
    ({"scale_dtype": "fp16"}, "scale_dtype"),
])
def test_settings_that_are_no_code_are_refused_in_one_line(params, message):
    with pytest.raises(CodecError, match=message):
        get_codec("rotated-ternary", **params)
