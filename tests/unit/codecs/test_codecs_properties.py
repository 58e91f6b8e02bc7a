"""Property tests shared by every registered codec, then codec-specific properties (hypothesis)."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geotrain.codecs import (
    CODECS,
    ErrorFeedback,
    ErrorFeedbackBank,
    Payload,
    approx_topk_indices,
    get_codec,
    pack_payload,
    pack_sign_bits,
    topk_indices,
    unpack_payload,
    unpack_sign_bits,
)
from geotrain.codecs.sign import pack_sign_bits_torch, unpack_sign_bits_torch

PROPERTY = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Every registered codec with defaults, plus variants that exercise parameters on small tensors.
VARIANTS: list[tuple[str, dict]] = [(name, {}) for name in CODECS] + [
    ("int8-block", {"block_size": 16}),
    ("topk", {"fraction": 0.1}),
    ("topk", {"fraction": 0.1, "value_dtype": "fp16"}),
    ("topk", {"fraction": 0.1, "selection": "sort"}),
    ("randk", {"fraction": 0.2, "seed": 5}),
    ("powersgd", {"rank": 2}),
    ("int4-block", {"block_size": 5}),
    ("fp4-block", {"block_size": 3}),
    ("int2-block", {"block_size": 7}),
    ("topk-lowbit", {"fraction": 0.25, "chunk_size": 16, "bits": 4}),
    ("log-block", {"bits": 8, "block_size": 6}),
    ("sign-block", {"block_size": 5}),
    ("rotated-sign", {"block_size": 4, "seed": 3}),
    ("rotated-sign", {"block_size": 8, "stochastic": True}),
    ("rotated-sign", {"block_size": 16, "stochastic": True, "clip": 1.5}),
    ("rotated-sign", {"block_size": 8, "scale_dtype": "bf16"}),
    ("rotated-ternary", {"block_size": 8, "scale_dtype": "bf16"}),
]
VARIANT_IDS = [name + "".join(f"-{k}={v}" for k, v in params.items()) for name, params in VARIANTS]


def test_every_registered_codec_is_in_the_shared_suite():
    assert set(CODECS) == {name for name, _ in VARIANTS}
    assert set(CODECS) == {"none", "fp16", "bf16", "int8", "int8-block", "topk", "randk", "sign", "powersgd",
                          "int4-block", "fp4-block", "int2-block", "topk-lowbit", "log-block", "sign-block",
                          "rotated-sign", "rotated-ternary"}


def float_tensors(max_abs: float = 1e4, max_side: int = 12, min_dims: int = 1, max_dims: int = 3):
    """fp32 tensors of 0..max_side**max_dims values in [-max_abs, max_abs], subnormals and zeros included."""
    shapes = hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0, max_side=max_side)
    max_abs = float(np.float32(max_abs))
    elements = st.floats(-max_abs, max_abs, width=32, allow_nan=False, allow_infinity=False)
    return hnp.arrays(np.float32, shapes, elements=elements).map(lambda a: torch.from_numpy(a.copy()))


def documented_nbytes(name: str, params: dict, shape: tuple[int, ...]) -> int:
    """The wire sizes docs/history/codecs.md states, computed independently of the codecs."""
    n = math.prod(shape)
    fraction = params.get("fraction", 0.01)
    k = min(n, max(1, int(fraction * n)))
    value_bytes = 2 if params.get("value_dtype") == "fp16" else 4
    if name == "none":
        return 4 * n
    if name in ("fp16", "bf16"):
        return 2 * n
    if name == "int8":
        return n + 4
    if name == "int8-block":
        return n + 4 * math.ceil(n / params.get("block_size", 256))
    if name == "topk":
        return k * (4 + value_bytes)
    if name == "randk":
        return k * value_bytes
    if name == "sign":
        return math.ceil(n / 8) + 4
    if name == "sign-block":
        return math.ceil(n / 8) + 4 * math.ceil(n / params.get("block_size", 128))
    if name == "rotated-sign":  # sign-block's bytes (scales of 2 bytes in bf16) and the 8-byte rotation key
        scale_bytes = 2 if params.get("scale_dtype") == "bf16" else 4
        return math.ceil(n / 8) + scale_bytes * math.ceil(n / params.get("block_size", 128)) + 8
    if name == "rotated-ternary":  # 5 trits a byte, the scales, the 8-byte rotation key
        codes = math.ceil(n / 5)
        scale_bytes = 2 if params.get("scale_dtype") == "bf16" else 4
        return codes + scale_bytes * math.ceil(n / params.get("block_size", 128)) + 8
    if name in ("int4-block", "fp4-block", "int2-block"):
        bits = 2 if name == "int2-block" else 4
        return math.ceil(n * bits / 8) + 4 * math.ceil(n / params.get("block_size", 128))
    if name == "log-block":  # codes plus two fp32 log bounds per block
        return math.ceil(n * params.get("bits", 4) / 8) + 8 * math.ceil(n / params.get("block_size", 128))
    if name == "topk-lowbit":
        chunk, bits = params.get("chunk_size", 4096), params.get("bits", 2)
        per_chunk = min(chunk, max(1, int(params.get("fraction", 1 / 64) * chunk)))
        chunks = math.ceil(n / chunk)
        kept = sum(min(per_chunk, n - c * chunk) for c in range(chunks))
        return 2 * kept + math.ceil(kept * bits / 8) + 4 * chunks
    if name == "powersgd":
        if len(shape) < 2:
            return 4 * n
        rows, cols = shape[0], n // shape[0] if shape[0] else 0
        r = min(params.get("rank", 4), rows, cols)
        return 4 * r * (rows + cols) if r * (rows + cols) < rows * cols else 4 * n
    raise AssertionError(name)


def peak(t: torch.Tensor) -> float:
    """max |t|, 0 for an empty tensor."""
    return float(t.abs().max()) if t.numel() else 0.0


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.numel() == 0 or torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                                         b.contiguous().reshape(-1).view(torch.uint8))


# ---- the shared suite ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,params", VARIANTS, ids=VARIANT_IDS)
@PROPERTY
@given(x=float_tensors())
def test_declared_bytes_equal_buffers_and_documented_formula(name, params, x):
    codec = get_codec(name, **params)
    payload = codec.encode(x)
    buffer_bytes = sum(t.numel() * t.element_size() for t in payload.buffers.values())
    assert payload.nbytes == buffer_bytes == codec.wire_nbytes(tuple(x.shape))
    assert payload.nbytes == documented_nbytes(name, params, tuple(x.shape))
    assert payload.spec().nbytes == payload.nbytes


@pytest.mark.parametrize("name,params", VARIANTS, ids=VARIANT_IDS)
@PROPERTY
@given(x=float_tensors())
def test_decode_restores_shape_dtype_and_is_deterministic(name, params, x):
    first, second = get_codec(name, **params), get_codec(name, **params)
    payload_a, payload_b = first.encode(x), second.encode(x.clone())
    assert list(payload_a.buffers) == list(payload_b.buffers)
    assert all(same_bits(payload_a.buffers[key], payload_b.buffers[key]) for key in payload_a.buffers)
    restored = first.decode(payload_a)
    assert restored.shape == x.shape and restored.dtype == x.dtype
    assert same_bits(restored, second.decode(payload_b))
    assert same_bits(restored, first.decode(payload_a))


@pytest.mark.parametrize("name,params", VARIANTS, ids=VARIANT_IDS)
@PROPERTY
@given(x=float_tensors(), seed=st.integers(0, 2**16))
def test_pack_unpack_is_bit_exact_and_specs_do_not_depend_on_data(name, params, x, seed):
    codec = get_codec(name, **params)
    payload = codec.encode(x)
    data = pack_payload(payload)
    assert data.dtype == torch.uint8 and data.dim() == 1 and data.numel() == payload.nbytes
    back = unpack_payload(data, payload.spec())
    assert back.spec() == payload.spec()
    assert all(same_bits(back.buffers[key], payload.buffers[key]) for key in payload.buffers)
    assert same_bits(codec.decode(back), codec.decode(payload))
    # Another worker's tensor of the same shape gives the same spec: all-gather can size its buffers.
    other = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)) * 100
    assert codec.encode(other).spec() == payload.spec() == codec.expected_spec(tuple(x.shape))


@pytest.mark.parametrize("name,params", VARIANTS, ids=VARIANT_IDS)
@PROPERTY
@given(shape=hnp.array_shapes(min_dims=1, max_dims=2, max_side=20), steps=st.integers(1, 6),
       seed=st.integers(0, 2**16))
def test_error_feedback_telescopes_sent_plus_residual_to_inputs(name, params, shape, steps, seed):
    codec = get_codec(name, **params)
    ef = ErrorFeedback(codec)
    generator = torch.Generator().manual_seed(seed)
    inputs_sum = torch.zeros(shape, dtype=torch.float64)
    sent_sum = torch.zeros(shape, dtype=torch.float64)
    magnitude = 0.0
    for step in range(steps):
        codec.set_step(step)
        x = torch.randn(shape, generator=generator) * 10
        payload = ef.encode(x)
        sent = ef.decode(payload)
        inputs_sum += x.double()
        sent_sum += sent.double()
        magnitude = max(magnitude, peak(x.abs() + sent.abs() + ef.residual.abs()))
    lhs = sent_sum + ef.residual.double()
    tolerance = 4 * steps * torch.finfo(torch.float32).eps * magnitude + 1e-30
    assert peak(lhs - inputs_sum) <= tolerance


@pytest.mark.parametrize("name,params", VARIANTS, ids=VARIANT_IDS)
@PROPERTY
@given(shape=hnp.array_shapes(min_dims=1, max_dims=2, max_side=16), split=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_error_feedback_state_round_trips_exactly(name, params, shape, split, seed):
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(shape, generator=generator) for _ in range(split + 2)]
    original = ErrorFeedback(get_codec(name, **params))
    for x in tensors[:split]:
        original.encode(x)
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)  # as a checkpoint would
    buffer.seek(0)
    restored = ErrorFeedback(get_codec(name, **params))
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert same_bits(restored.residual, original.residual)
    for x in tensors[split:]:
        a, b = original.encode(x), restored.encode(x)
        assert all(same_bits(a.buffers[key], b.buffers[key]) for key in a.buffers)
    assert same_bits(restored.residual, original.residual)


@pytest.mark.parametrize("name,params", [v for v in VARIANTS if CODECS[v[0]].summable],
                         ids=[i for v, i in zip(VARIANTS, VARIANT_IDS) if CODECS[v[0]].summable])
@PROPERTY
@given(shape=hnp.array_shapes(min_dims=1, max_dims=2, max_side=30), seed=st.integers(0, 2**16))
def test_summable_payloads_sum_in_compressed_form(name, params, shape, seed):
    """Two workers' payloads, summed buffer by buffer (what all-reduce does), decode to the sum."""
    codec = get_codec(name, **params)
    codec.set_step(seed % 7)
    generator = torch.Generator().manual_seed(seed)
    a, b = codec.encode(torch.randn(shape, generator=generator)), codec.encode(torch.randn(shape, generator=generator))
    summed = Payload(a.codec, {key: a.buffers[key] + b.buffers[key] for key in a.buffers}, a.shape, a.dtype, a.meta)
    expected = codec.decode(a) + codec.decode(b)
    relative = 2.0**-8 if name == "bf16" else 2.0**-11
    assert torch.allclose(codec.decode(summed), expected, rtol=relative, atol=1e-6)


# ---- codec-specific properties ------------------------------------------------------------------
@PROPERTY
@given(x=float_tensors(max_abs=6.5e4))
def test_fp16_relative_error_is_at_most_half_an_ulp(x):
    error = (get_codec("fp16").roundtrip(x)[0] - x).abs()
    assert bool((error <= 2.0**-11 * x.abs() + 2.0**-25).all())  # 2**-25: half the subnormal spacing


@PROPERTY
@given(x=float_tensors(max_abs=1e30))
def test_bf16_relative_error_is_at_most_half_an_ulp(x):
    error = (get_codec("bf16").roundtrip(x)[0] - x).abs()
    assert bool((error <= 2.0**-8 * x.abs() + 1e-40).all())


@pytest.mark.parametrize("name,block", [("int8", None), ("int8-block", 256), ("int8-block", 16), ("int8-block", 7)])
@PROPERTY
@given(x=float_tensors(max_abs=1e6, max_side=40, max_dims=2))
def test_int8_error_is_at_most_half_a_step_of_its_block(name, block, x):
    codec = get_codec(name) if block is None else get_codec(name, block_size=block)
    payload = codec.encode(x)
    flat = x.reshape(-1)
    n = flat.numel()
    size = block or max(n, 1)
    blocks = [flat[i:i + size] for i in range(0, n, size)] or ([flat] if block is None else [])
    scales = payload.buffers["scales"]
    assert scales.numel() == len(blocks)
    restored = codec.decode(payload).reshape(-1)
    codes = payload.buffers["codes"]
    assert peak(codes.int()) <= 127
    for i, values in enumerate(blocks):
        group_peak = peak(values)
        assert float(scales[i]) == pytest.approx(group_peak / 127, rel=1e-6, abs=1e-44)
        error = (restored[i * size:i * size + values.numel()] - values).abs()
        assert peak(error) <= float(scales[i]) * (0.5 + 1e-4) + 1e-36


@PROPERTY
@given(x=float_tensors(max_abs=1e6, max_side=30, max_dims=2), block=st.integers(1, 40))
def test_int8_block_matches_a_per_block_reference(x, block):
    """The vectorised encoder equals a plain loop over blocks, bit for bit."""
    payload = get_codec("int8-block", block_size=block).encode(x)
    flat = x.reshape(-1)
    for i, start in enumerate(range(0, flat.numel(), block)):
        values = flat[start:start + block]
        peak = values.abs().max()
        inverse = torch.clamp(127 / peak, max=torch.finfo(torch.float32).max) if peak > 0 else torch.tensor(0.0)
        assert torch.equal(payload.buffers["codes"][start:start + block], (values * inverse).round().to(torch.int8))
        assert same_bits(payload.buffers["scales"][i].reshape(1), (peak / 127).reshape(1))


@pytest.mark.parametrize("params", [{"fraction": 0.05}, {"fraction": 0.3, "value_dtype": "fp16"},
                                    {"fraction": 0.05, "selection": "sort"}])
@PROPERTY
@given(x=float_tensors(max_abs=1e4, max_side=30, max_dims=2))
def test_topk_keeps_exactly_the_k_largest_magnitudes(params, x):
    codec = get_codec("topk", **params)
    payload = codec.encode(x)
    flat = x.reshape(-1)
    k = codec.k_for(flat.numel())
    indices = payload.buffers["indices"].long()
    assert indices.numel() == k == payload.meta["k"] and indices.unique().numel() == k
    kept = flat[indices].abs().sort().values
    assert torch.equal(kept, flat.abs().sort().values[flat.numel() - k:])
    values = flat[indices].to(payload.buffers["values"].dtype)
    assert same_bits(payload.buffers["values"], values)
    restored = codec.decode(payload).reshape(-1)
    mask = torch.zeros(flat.numel(), dtype=torch.bool)
    mask[indices] = True
    assert torch.equal(restored[indices], values.float()) and not restored[~mask].any()


@PROPERTY
@given(x=float_tensors(max_abs=1e4, max_side=30, max_dims=2))
def test_sign_keeps_every_sign_and_the_mean_magnitude(x):
    payload = get_codec("sign").encode(x)
    restored = get_codec("sign").decode(payload)
    scale = float(payload.buffers["scale"][0])
    assert scale == pytest.approx(float(x.abs().double().mean()) if x.numel() else 0.0, rel=1e-5, abs=1e-40)
    assert payload.buffers["bits"].dtype == torch.uint8 and payload.buffers["bits"].numel() == math.ceil(x.numel() / 8)
    if scale > 0:
        assert bool((restored.abs() == scale).all())
        nonzero = x != 0
        assert torch.equal(restored[nonzero].sign(), x[nonzero].sign())
        assert bool((restored[x == 0] == scale).all())  # documented: sign(0) decodes to +scale


@PROPERTY
@given(bits=hnp.arrays(np.bool_, st.integers(0, 100)))
def test_sign_bit_packing_matches_a_plain_loop(bits):
    flat = torch.from_numpy(np.where(bits, -1.0, 1.0).astype(np.float32))
    packed = pack_sign_bits(flat)
    reference = [sum(int(bits[8 * j + i]) << i for i in range(8) if 8 * j + i < bits.size)
                 for j in range(math.ceil(bits.size / 8))]
    assert packed.tolist() == reference
    assert unpack_sign_bits(packed, bits.size).numpy().tolist() == bits.tolist()
    # the torch operations a GPU tensor is packed with (run here on the CPU): the same bytes and bits
    assert pack_sign_bits_torch(flat).tolist() == reference
    assert unpack_sign_bits_torch(packed, bits.size).tolist() == bits.tolist()


@PROPERTY
@given(x=float_tensors(max_side=30, max_dims=2), step=st.integers(0, 1000), seed=st.integers(0, 100))
def test_randk_sends_the_values_of_the_shared_mask(x, step, seed):
    sender, receiver = get_codec("randk", fraction=0.1, seed=seed), get_codec("randk", fraction=0.1, seed=seed)
    sender.set_step(step)
    payload = sender.encode(x)
    assert payload.meta["step"] == step
    flat = x.reshape(-1)
    indices = sender.indices(flat.numel(), step)
    assert indices.numel() == sender.k_for(flat.numel()) and indices.unique().numel() == indices.numel()
    assert torch.equal(payload.buffers["values"], flat[indices])
    restored = receiver.decode(payload).reshape(-1)  # receiver at another step: meta carries the step
    expected = torch.zeros_like(flat)
    expected[indices] = flat[indices]
    assert torch.equal(restored, expected)


def test_randk_mask_changes_with_step_and_seed_and_is_uniform():
    codec = get_codec("randk", fraction=0.1, seed=1)
    masks = {tuple(codec.indices(1000, step).tolist()) for step in range(20)}
    assert len(masks) == 20
    assert not torch.equal(get_codec("randk", seed=2).indices(10_000, 0), get_codec("randk", seed=1).indices(10_000, 0))
    counts = torch.zeros(200)
    for step in range(1000):
        counts[codec.indices(200, step)] += 1  # k = 20 of 200: expected count 100 +- 9.5 per index
    assert 60 < float(counts.min()) and float(counts.max()) < 140
    big = codec.indices(1_000_000, 3)  # the sampled-with-replacement path
    assert big.numel() == 100_000 and big.unique().numel() == 100_000 and torch.equal(big, big.sort().values)


@pytest.mark.parametrize("shape,rank", [((64, 48), 4), ((30, 5, 6), 2), ((100, 20), 1), ((9, 200), 3)])
def test_powersgd_reconstructs_matrices_of_low_rank(shape, rank):
    generator = torch.Generator().manual_seed(sum(shape))
    left = torch.randn(shape[0], rank, generator=generator)
    right = torch.randn(rank, math.prod(shape[1:]), generator=generator)
    matrix = (left @ right).reshape(shape)
    codec = get_codec("powersgd", rank=rank)
    payload = codec.encode(matrix)
    assert set(payload.buffers) == {"p", "q"} and payload.buffers["p"].shape == (shape[0], rank)
    restored = codec.decode(payload)
    assert torch.allclose(restored, matrix, atol=1e-4 * float(matrix.abs().max()))
    p = payload.buffers["p"]
    assert torch.allclose(p.T @ p, torch.eye(rank), atol=1e-5)


def test_powersgd_power_iterations_approach_the_best_rank_r_fit():
    matrix = torch.randn(96, 128, generator=torch.Generator().manual_seed(5))  # a flat spectrum: the hard case
    best = torch.linalg.svdvals(matrix)[2:].square().sum().sqrt()  # the rank-2 truncated SVD's error
    errors = [float((get_codec("powersgd", rank=2, power_iterations=k).roundtrip(matrix)[0] - matrix).norm())
              for k in (1, 8)]
    assert errors[1] < errors[0] and errors[1] < 1.01 * float(best)


@PROPERTY
@given(x=float_tensors(max_dims=1, max_side=50))
def test_powersgd_sends_vectors_uncompressed(x):
    payload = get_codec("powersgd").encode(x)
    assert set(payload.buffers) == {"raw"}
    assert torch.equal(get_codec("powersgd").decode(payload), x)


def test_error_feedback_bank_state_round_trips():
    bank = ErrorFeedbackBank(get_codec("sign"))
    generator = torch.Generator().manual_seed(0)
    for key in ("a", "b", 3):
        bank.encode(key, torch.randn(17, generator=generator))
    copy = ErrorFeedbackBank(get_codec("sign"))
    copy.load_state_dict(bank.state_dict())
    x = torch.randn(17, generator=generator)
    for key in ("a", "b", 3):
        assert same_bits(copy.encode(key, x).buffers["bits"], bank.encode(key, x).buffers["bits"])
        assert same_bits(copy[key].residual, bank[key].residual)


@pytest.mark.parametrize("distribution", ["normal", "heavy-tailed", "mostly-zero", "ties", "sorted-ramp"])
@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.1])
def test_approximate_topk_returns_the_exact_top_k_magnitudes_on_large_tensors(distribution, fraction):
    n = 200_000
    generator = torch.Generator().manual_seed(11)
    x = {
        "normal": lambda: torch.randn(n, generator=generator),
        "heavy-tailed": lambda: torch.randn(n, generator=generator) ** 3 * 1e-3,
        "mostly-zero": lambda: torch.randn(n, generator=generator) * (torch.rand(n, generator=generator) < 0.002),
        "ties": lambda: torch.randint(-3, 4, (n,), generator=generator).float(),
        "sorted-ramp": lambda: torch.linspace(-1, 1, n),
    }[distribution]()
    k = max(1, int(fraction * n))
    approximate = approx_topk_indices(x, k, seed=3)
    exact = topk_indices(x, k)
    assert approximate.numel() == k and approximate.unique().numel() == k
    assert torch.equal(x[approximate].abs().sort().values, x[exact].abs().sort().values)
    assert torch.equal(approximate, approx_topk_indices(x, k, seed=3))  # deterministic for a seed


@pytest.mark.parametrize("name", sorted(CODECS))
def test_warm_up_leaves_the_codec_as_it_was(name):
    """warm_up runs a new codec of the same parameters: the step and every later payload are unchanged."""
    codec, twin = get_codec(name), get_codec(name)
    codec.set_step(3)
    twin.set_step(3)
    codec.warm_up()
    assert codec.step == 3
    x = torch.randn(70_000, generator=torch.Generator().manual_seed(1))
    a, b = codec.encode(x), twin.encode(x)
    assert a.spec() == b.spec()
    assert all(torch.equal(u, v) for u, v in zip(a.buffers.values(), b.buffers.values(), strict=True))
