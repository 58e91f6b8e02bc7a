"""Distributed PowerSGD in one process (`PowerSGDReducer` through the simulated trainer's GradientExchange): which matrices
are compressed, exactness on low-rank means, bytes, non-finite gradients, state checks."""

import math
from dataclasses import asdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.codecs import CodecError, NonFiniteGradientError
from geotrain.codecs.powersgd import orthonormal_columns
from geotrain.comm import PowerSGDConfig, PowerSGDLayout, compressed_rank
from geotrain.sim import GradientExchange


def _powersgd_exchange(named_shapes, workers, config=PowerSGDConfig()):
    """The simulated trainer's exchange through the `powersgd` reducer with `config`'s settings."""
    return GradientExchange("powersgd", named_shapes, workers, **asdict(config))


@pytest.mark.parametrize(("shape", "config", "expected"), [
    ((128,), PowerSGDConfig(rank=8), 0),                                # vectors go uncompressed
    ((384, 128), PowerSGDConfig(rank=8), 8),
    ((44, 128), PowerSGDConfig(rank=8), 8),                             # 5632 > 2 x 8 x 172 = 2752
    ((16, 16), PowerSGDConfig(rank=4), 0),                              # 256 > 2 x 4 x 32 = 256 fails
    ((16, 16), PowerSGDConfig(rank=4, min_compression_rate=1.9), 4),
    ((3, 200), PowerSGDConfig(rank=8), 0),                              # r = min(8, 3) = 3: 600 > 1218 fails
    ((3, 200), PowerSGDConfig(rank=8, min_compression_rate=0.5), 3),
    ((24, 3, 6), PowerSGDConfig(rank=2), 2),                            # a 24 x 18 matrix
])
def test_compressed_rank_follows_min_compression_rate(shape, config, expected):
    assert compressed_rank(shape, config) == expected


@pytest.mark.parametrize("bad", [{"rank": 0}, {"rank": True}, {"start_powersgd_iter": -1},
                                 {"min_compression_rate": 0.0}, {"min_compression_rate": math.inf}, {"seed": -2}])
def test_config_rejects_out_of_range_values(bad):
    with pytest.raises(CodecError):
        PowerSGDConfig(**bad)


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 24), m=st.integers(1, 24), workers=st.integers(1, 4), rank=st.integers(1, 5),
       true_rank=st.integers(0, 5), seed=st.integers(0, 2**16))
def test_mean_of_rank_at_most_r_is_reconstructed_exactly_and_never_nan(n, m, workers, rank, true_rank, seed):
    """All workers' matrices in one rank-`true_rank` column space: the mean M has rank <= true_rank and
    P^ Q^T == M after the P/Q round whenever true_rank <= r (zero matrices, rank-deficient P included).
    Exact in exact arithmetic; in float32 the power step's error is rounding x |M| / s, s the
    true_rank-th singular value of M Q (the start Q, orthonormalised): the tolerance scales with it.
    Without error feedback: with it, step 1 would also deliver the mean of step 0's residuals (M_w - M'),
    i.e. step 0's rounding error, which scales with step 0's matrix, not step 1's (hypothesis found
    n=19, m=1, workers=2, rank=1, true_rank=1, seed=255: 1.2e-7 carried against a tolerance of 4.6e-8)."""
    g = torch.Generator().manual_seed(seed)
    config = PowerSGDConfig(rank=rank, min_compression_rate=0.01, error_feedback=False)
    exchange = _powersgd_exchange([("w", (n, m)), ("b", (m,))], workers, config)
    r = min(rank, n, m)
    exchange.load_state_dict({"config": {"rank": rank}, "iteration": 0, "residuals": [{}] * workers,
                              "qs": {"w": torch.randn(m, r, generator=g)}})
    basis = torch.randn(n, true_rank, generator=g)
    for step in range(2):  # a given start, then the warm start
        start = orthonormal_columns(exchange.state_dict()["qs"]["w"])
        mats = [basis @ torch.randn(true_rank, m, generator=g) for _ in range(workers)]
        vecs = [torch.randn(m, generator=g) for _ in range(workers)]
        out = exchange.exchange([_flat([a, b]) for a, b in zip(mats, vecs)], step)
        mean = sum(mats) / workers
        got = out.gradient[:n * m].view(n, m)
        assert torch.isfinite(out.gradient).all()
        if true_rank <= r:
            scale = float(torch.linalg.matrix_norm(mean, ord=2)) + 1e-30
            singular = torch.linalg.svdvals(mean.double() @ start.double())
            captured = float(singular[true_rank - 1]) if true_rank else scale
            assert float((got - mean).abs().max()) <= 1e-5 * scale * max(1.0, scale / captured)
        assert torch.allclose(out.gradient[n * m:], sum(vecs) / workers, rtol=1e-6, atol=1e-6)
        assert out.bytes_sent == workers * 4 * (m + r * (n + m))


def test_bytes_before_and_after_start_and_the_warm_start_is_shared():
    shapes = [("w", (40, 30)), ("b", (40,)), ("small", (2, 2))]
    exchange = _powersgd_exchange(shapes, 3, PowerSGDConfig(rank=4, start_powersgd_iter=2))
    layout = exchange.reducer.layout
    assert layout.ranks == (4, 0, 0)
    assert layout.step_bytes(False) == (4 * (1200 + 40 + 4),)
    assert layout.step_bytes(True) == (4 * (40 + 4 + 40 * 4), 4 * 30 * 4)
    g = torch.Generator().manual_seed(0)
    sent = []
    for step in range(4):
        grads = [torch.randn(1244, generator=g) for _ in range(3)]
        out = exchange.exchange(grads, step)
        if step < 2:  # uncompressed: the exact mean
            assert torch.allclose(out.gradient, sum(grads) / 3, atol=1e-6)
        sent.append(out.bytes_sent)
    assert sent == [3 * 4 * 1244] * 2 + [3 * 4 * (40 + 4 + 160 + 120)] * 2
    assert set(exchange.state_dict()["qs"]) == {"w"} and exchange.reducer.iteration == 4


def test_error_feedback_delivers_what_was_held_back():
    """Sum of delivered means + mean residual == sum of mean gradients (nothing lost, only delayed)."""
    g = torch.Generator().manual_seed(3)
    exchange = _powersgd_exchange([("w", (20, 16))], 2, PowerSGDConfig(rank=1))
    delivered, wanted = torch.zeros(320), torch.zeros(320)
    for step in range(5):
        grads = [torch.randn(320, generator=g) for _ in range(2)]
        delivered += exchange.exchange(grads, step).gradient
        wanted += (grads[0] + grads[1]) / 2
    held = sum(worker["w"] for worker in exchange.reducer.residuals) / 2
    assert torch.allclose(delivered + held, wanted, atol=1e-5)
    assert not torch.allclose(delivered, wanted, atol=1e-2)  # rank 1 did hold something back


def test_non_finite_gradients_raise_on_every_worker_or_propagate_when_allowed():
    shapes = [("w", (20, 16)), ("b", (20,))]
    grads = [torch.randn(340, generator=torch.Generator().manual_seed(w)) for w in range(2)]
    bad = [grads[0].clone(), grads[1]]
    bad[0][5] = math.nan
    strict = _powersgd_exchange(shapes, 2, PowerSGDConfig(rank=2))
    strict.exchange(grads, 0)
    before = strict.state_dict()
    with pytest.raises(NonFiniteGradientError, match="NaN/inf"):
        strict.exchange(bad, 1)
    lenient = _powersgd_exchange(shapes, 2, PowerSGDConfig(rank=2, allow_nonfinite=True))
    lenient.exchange(grads, 0)
    out = lenient.exchange(bad, 1)
    assert torch.isnan(out.gradient[:320]).all() and torch.isfinite(out.gradient[320:]).all()
    kept = lenient.state_dict()  # residuals and Q's keep their values from step 0
    assert torch.equal(kept["qs"]["w"], before["qs"]["w"])
    assert all(torch.equal(kept["residuals"][w]["w"], before["residuals"][w]["w"]) for w in range(2))


def test_state_round_trip_is_exact_and_mismatches_are_refused():
    shapes = [("w", (20, 16)), ("b", (20,))]
    g = torch.Generator().manual_seed(5)
    stream = [[torch.randn(340, generator=g) for _ in range(2)] for _ in range(6)]
    straight = _powersgd_exchange(shapes, 2, PowerSGDConfig(rank=2))
    expected = [straight.exchange(grads, step).gradient for step, grads in enumerate(stream)]
    first = _powersgd_exchange(shapes, 2, PowerSGDConfig(rank=2))
    for step in range(3):
        first.exchange(stream[step], step)
    resumed = _powersgd_exchange(shapes, 2, PowerSGDConfig(rank=2))
    resumed.load_state_dict(first.state_dict())
    for step in range(3, 6):
        assert torch.equal(resumed.exchange(stream[step], step).gradient, expected[step])
    saved = first.state_dict()
    with pytest.raises(CodecError, match="rank 2"):
        _powersgd_exchange(shapes, 2, PowerSGDConfig(rank=3)).load_state_dict(saved)
    with pytest.raises(CodecError, match="residual"):
        _powersgd_exchange([("w", (20, 8)), ("b", (20,))], 2, PowerSGDConfig(rank=2)).load_state_dict(
            {**saved, "qs": {}})
    with pytest.raises(CodecError, match="workers' residuals"):
        _powersgd_exchange(shapes, 3, PowerSGDConfig(rank=2)).load_state_dict(saved)


def test_layout_rejects_duplicate_names():
    with pytest.raises(CodecError, match="unique"):
        PowerSGDLayout.build([("w", (4, 4)), ("w", (4,))], PowerSGDConfig())
