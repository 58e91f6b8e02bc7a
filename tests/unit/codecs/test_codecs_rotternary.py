"""rotated-ternary (codecs/rotternary.py): the projection on the input is exact, the mean over rotation seeds
converges to the input, every code leaves less noise than rotated-sign's 1-bit code, the packings invert, and
settings that are no code are refused."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.codecs import CodecError, get_codec
from geotrain.codecs.rotternary import pack_indices, pack_trits, unpack_indices, unpack_trits

PROPERTY = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(n=st.integers(1, 300), group=st.sampled_from([1, 4]), block=st.sampled_from([4, 32, 128]),
       seed=st.integers(0, 2**16))
def test_the_projection_on_the_input_is_exact(n, group, block, seed):
    """scale = |y|^2 / <y, t> per block: <x', x> = |x|^2, the error orthogonal to the input."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float()
    decoded, _ = get_codec("rotated-ternary", group=group, block_size=block, seed=seed).roundtrip(x)
    assert float((decoded.double() * x.double()).sum()) == pytest.approx(float(x.double().norm() ** 2), rel=1e-4)


@pytest.mark.parametrize("group", [1, 4])
def test_the_mean_over_seeds_converges_to_the_input(group):
    """N rotations with per-draw error energy V average to an error of energy about V / N (bound 4 V / N)."""
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.1, 3.0, 128)
    draws = 32
    decoded = [get_codec("rotated-ternary", group=group, seed=s).roundtrip(x)[0].double() for s in range(draws)]
    energy = sum(float((d - x.double()).norm() ** 2) for d in decoded) / draws
    assert float((torch.stack(decoded).mean(dim=0) - x.double()).norm() ** 2) <= 4 * energy / draws


def test_every_code_leaves_less_noise_than_rotated_signs():
    """Noise energy over |x|^2 on a Gaussian 96 x 128 tensor: rotated-sign ~0.57, group 4 ~0.36 (about the same
    bytes), group 1 ~0.23 (1.6 bits a value)."""
    x = torch.randn(96, 128, generator=torch.Generator().manual_seed(1))
    noise = {}
    for name, params in (("rotated-sign", {}), ("rotated-ternary", {"group": 4, "block_size": 512}),
                         ("rotated-ternary", {"group": 1})):
        decoded, _ = get_codec(name, **params).roundtrip(x)
        noise[params.get("group", 0)] = float((decoded - x).norm() ** 2 / x.norm() ** 2)
    assert noise[1] < 0.26 < noise[4] < 0.40 < noise[0], noise


@PROPERTY
@given(codes=st.lists(st.integers(0, 2), max_size=23), indices=st.lists(st.integers(0, 31), max_size=23))
def test_trit_and_index_packings_invert_and_take_their_bytes(codes, indices):
    trits = torch.tensor(codes, dtype=torch.int64)
    packed = pack_trits(trits)
    assert packed.numel() == math.ceil(len(codes) / 5) and torch.equal(unpack_trits(packed, len(codes)), trits)
    for bits, scale in ((5, 1), (11, 61)):  # and 11-bit indices up to 1,891
        words = torch.tensor(indices, dtype=torch.int64) * scale
        packed = pack_indices(words, bits)
        assert packed.numel() == math.ceil(bits * len(indices) / 8)
        assert torch.equal(unpack_indices(packed, len(indices), bits), words)


@pytest.mark.parametrize("params,message", [
    ({"group": 2}, "group must be 1 or 4, got 2"),
    ({"block_size": 96}, "block_size must be a power of two, got 96"),
    ({"block_size": 2, "group": 4}, "block_size=2 with group=4: a block must hold whole groups"),
    ({"scale_dtype": "fp16"}, "scale_dtype"),
])
def test_settings_that_are_no_code_are_refused_in_one_line(params, message):
    with pytest.raises(CodecError, match=message):
        get_codec("rotated-ternary", **params)
