"""The low-bit codecs (int4-block, fp4-block, int2-block, topk-lowbit): error bounds, byte-exact packing,
empty and odd sizes, against plain references (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geotrain.codecs import CodecError, get_codec, pack_codes, pack_payload, unpack_codes, unpack_payload
from geotrain.codecs.lowbit import GRIDS, dequantize_blocks, quantize_blocks

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BLOCK_CODECS = {"int4-block": ("int4", 1 / 14), "fp4-block": ("fp4", 1 / 6), "int2-block": ("int2", 1 / 3)}
"""name -> (grid, worst error as a fraction of the block peak: half the widest gap of the grid)."""


def vectors(max_n: int = 700, max_abs: float = 1e3):
    elements = st.floats(-max_abs, max_abs, width=32, allow_nan=False, allow_infinity=False)
    return hnp.arrays(np.float32, st.integers(0, max_n), elements=elements).map(lambda a: torch.from_numpy(a.copy()))


def test_grids_are_the_documented_levels():
    assert GRIDS["int4"][1].tolist() == pytest.approx([k / 7 for k in range(-7, 8)])
    e2m1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert GRIDS["fp4"][1].tolist() == pytest.approx(sorted({s * v / 6 for v in e2m1 for s in (-1, 1)}))
    assert GRIDS["int2"][1].tolist() == pytest.approx([-1, -1 / 3, 1 / 3, 1])
    for name, (bits, grid) in GRIDS.items():
        assert grid.numel() <= 2**bits and grid[0] == -1 and grid[-1] == 1
        widest = float((grid[1:] - grid[:-1]).max())
        assert widest / 2 == pytest.approx(BLOCK_CODECS[f"{name}-block"][1])


@pytest.mark.parametrize("name", sorted(BLOCK_CODECS))
@PROPERTY
@given(x=vectors(), block=st.sampled_from([1, 3, 8, 64, 128]))
def test_block_error_is_at_most_half_the_widest_gap_of_its_peak(name, x, block):
    codec = get_codec(name, block_size=block)
    restored, nbytes = codec.roundtrip(x)
    bits = GRIDS[BLOCK_CODECS[name][0]][0]
    assert nbytes == math.ceil(x.numel() * bits / 8) + 4 * math.ceil(x.numel() / block) == codec.wire_nbytes(x.shape)
    n = x.numel()
    for start in range(0, n, block):
        piece, back = x[start:start + block], restored[start:start + block]
        peak = float(piece.abs().max())
        bound = BLOCK_CODECS[name][1] * peak * (1 + 1e-6) + 1e-30
        assert float((back - piece).abs().max()) <= bound
        assert float(back.abs().max()) <= peak  # never beyond the block's range


@pytest.mark.parametrize("name", sorted(BLOCK_CODECS))
@PROPERTY
@given(x=vectors(), block=st.integers(1, 40))
def test_pack_unpack_is_byte_exact_and_decoding_is_nearest_level(name, x, block):
    codec = get_codec(name, block_size=block)
    payload = codec.encode(x)
    data = pack_payload(payload)
    assert data.numel() == payload.nbytes == codec.wire_nbytes(x.shape)
    assert torch.equal(codec.decode(unpack_payload(data, payload.spec())), codec.decode(payload))
    # reference: every value decodes to the level nearest to x / peak (ties to the lower level)
    grid = GRIDS[BLOCK_CODECS[name][0]][1].double()
    restored = codec.decode(payload).double()
    for i in range(x.numel()):
        start = i - i % block
        peak = float(x[start:start + block].abs().max())
        if peak == 0:
            assert restored[i] == 0
            continue
        y = float(x[i]) / peak
        distances = (grid - y).abs()
        best = float(distances.min())
        # fp32 rounding of grid * peak: relative, or one subnormal step (2**-149) for tiny peaks
        error = abs(float(restored[i]) - float(x[i]))
        assert abs(error - best * peak) <= 1e-5 * peak + 2.0 ** -149


@PROPERTY
@given(codes=st.lists(st.integers(0, 15), max_size=99), bits=st.sampled_from([2, 4]))
def test_code_packing_matches_a_plain_loop(codes, bits):
    codes = [c % (1 << bits) for c in codes]
    packed = pack_codes(torch.tensor(codes, dtype=torch.uint8), bits)
    per = 8 // bits
    expected = [sum(c << (bits * j) for j, c in enumerate(codes[i:i + per])) for i in range(0, len(codes), per)]
    assert packed.tolist() == expected  # two 4-bit codes (four 2-bit codes) per byte, low bits first
    assert unpack_codes(packed, bits, len(codes)).tolist() == codes


def torch_quantize_reference(flat: torch.Tensor, block: int, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The codes and peaks by plain torch operations (the compiled kernels' first implementation)."""
    n = flat.numel()
    blocks = -(-n // block)
    padded = torch.zeros(blocks * block, dtype=torch.float32)
    padded[:n] = flat.abs()
    peaks = padded.view(blocks, block).amax(dim=1)
    peaks = torch.where(torch.isnan(padded.view(blocks, block)).any(dim=1), torch.full_like(peaks, math.nan), peaks)
    per_value = peaks[torch.arange(n) // block]
    safe = torch.where(torch.isfinite(per_value) & (per_value > 0), per_value, torch.ones_like(per_value))
    y = torch.where(torch.isfinite(per_value), flat / safe, torch.zeros_like(flat))
    return torch.bucketize(y, (grid[1:] + grid[:-1]) / 2).to(torch.uint8), peaks


def special_vectors(max_n: int = 300):
    """fp32 vectors mixing zeros, signed zeros, infinities, NaN and values exactly on a grid midpoint."""
    elements = st.one_of(st.floats(-1e3, 1e3, width=32), st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan]),
                         st.sampled_from([1 / 14, 3 / 14, -5 / 14, 0.25, 0.75, -1 / 12, 1 / 3, 2 / 3]))
    return hnp.arrays(np.float32, st.integers(0, max_n), elements=elements).map(lambda a: torch.from_numpy(a.copy()))


@PROPERTY
@given(x=special_vectors(), block=st.integers(1, 40), grid=st.sampled_from(sorted(GRIDS)))
def test_compiled_quantisation_equals_the_torch_reference_bit_for_bit(x, block, grid):
    levels = GRIDS[grid][1]
    codes, peaks = quantize_blocks(x, block, levels)
    expected_codes, expected_peaks = torch_quantize_reference(x, block, levels)
    assert codes.tolist() == expected_codes.tolist()
    assert np.array_equal(peaks.numpy(), expected_peaks.numpy(), equal_nan=True)
    assert np.array_equal(peaks.numpy().view(np.int32)[~np.isnan(peaks.numpy())],
                          expected_peaks.numpy().view(np.int32)[~np.isnan(expected_peaks.numpy())])  # -0 too
    values = dequantize_blocks(codes, peaks, block, levels, "test")
    per_value = expected_peaks[torch.arange(x.numel()) // block]
    expected = torch.where(torch.isfinite(per_value), levels[expected_codes.to(torch.int64)] * per_value,
                           torch.full_like(per_value, math.nan))
    nan = np.isnan(expected.numpy())
    assert np.array_equal(np.isnan(values.numpy()), nan)
    assert np.array_equal(values.numpy().view(np.int32)[~nan], expected.numpy().view(np.int32)[~nan])


def test_dequantize_refuses_too_few_block_scales():
    levels = GRIDS["int4"][1]
    with pytest.raises(CodecError, match="2 block scales for 9 values in blocks of 4"):
        dequantize_blocks(torch.zeros(9, dtype=torch.uint8), torch.ones(2), 4, levels, "payload")
    with pytest.raises(CodecError, match="hold 4 4-bit codes, not 5"):
        unpack_codes(torch.zeros(2, dtype=torch.uint8), 4, 5)


@pytest.mark.parametrize("shape", [(0,), (1,), (3,), (5, 7), (2, 0, 3), ()])
@pytest.mark.parametrize("name", sorted(BLOCK_CODECS) + ["topk-lowbit"])
def test_empty_and_odd_sizes_round_trip_with_declared_bytes(name, shape):
    codec = get_codec(name)
    x = torch.arange(1.0, math.prod(shape) + 1.0).reshape(shape) * ((-1) ** torch.arange(math.prod(shape))).reshape(shape)
    payload = codec.encode(x)
    assert payload.nbytes == codec.wire_nbytes(shape) == pack_payload(payload).numel()
    restored = codec.decode(payload)
    assert restored.shape == x.shape
    if x.numel():
        assert float(restored.abs().max()) == float(x.abs().max())  # the peak is always exact


def test_decode_refuses_codes_beyond_the_grid():
    codec = get_codec("int4-block", block_size=4)
    payload = codec.encode(torch.randn(8))
    bad = dict(payload.buffers, codes=torch.full_like(payload.buffers["codes"], 0xFF))  # code 15: no level
    with pytest.raises(CodecError, match="code 15 is beyond the grid's 15 levels"):
        codec.decode(type(payload)(payload.codec, bad, payload.shape, payload.dtype, payload.meta))


@PROPERTY
@given(x=vectors(max_n=2000), chunk=st.sampled_from([1, 7, 64, 256]), fraction=st.sampled_from([0.05, 0.25, 1.0]),
       bits=st.sampled_from([2, 4]))
def test_topk_lowbit_keeps_each_chunks_largest_within_the_grid_error(x, chunk, fraction, bits):
    codec = get_codec("topk-lowbit", fraction=fraction, chunk_size=chunk, bits=bits)
    payload = codec.encode(x)
    data = pack_payload(payload)
    assert data.numel() == payload.nbytes == codec.wire_nbytes(x.shape)
    restored = codec.decode(unpack_payload(data, payload.spec()))
    assert torch.equal(restored, codec.decode(payload))
    k = min(chunk, max(1, int(fraction * chunk)))
    half_gap = 1 / 14 if bits == 4 else 1 / 3
    kept_positions = payload.buffers["indices"].to(torch.int64)
    at = 0
    for start in range(0, x.numel(), chunk):
        piece, back = x[start:start + chunk], restored[start:start + chunk]
        keep = min(k, piece.numel())
        local = kept_positions[at:at + keep]
        at += keep
        assert torch.equal(local, local.sort().values) and local.unique().numel() == keep
        peak = float(piece.abs().max())
        kept = torch.zeros(piece.numel(), dtype=torch.bool)
        kept[local] = True
        # kept values: within the grid's error; dropped: zero and no larger than any kept one
        assert float((back[kept] - piece[kept]).abs().max()) <= half_gap * peak * (1 + 1e-6) + 1e-30
        assert torch.all(back[~kept] == 0)
        if (~kept).any():
            assert float(piece[~kept].abs().max()) <= float(piece[kept].abs().min())


def test_topk_lowbit_default_costs_under_four_hundredths_of_a_byte_per_value():
    codec = get_codec("topk-lowbit")
    n = 1 << 20
    assert codec.wire_nbytes((n,)) / n == pytest.approx((64 * 2.25 + 4) / 4096)
    assert get_codec("int4-block").wire_nbytes((n,)) / n == pytest.approx(0.5 + 4 / 128)
    assert get_codec("int2-block").wire_nbytes((n,)) / n == pytest.approx(0.25 + 4 / 128)
