"""Simulated data-parallel training with compressed gradients: exchange, clipping, bytes, reproducibility."""

import math

import pytest
import torch

from geotrain.codecs import get_codec
from geotrain.comm import clip_grad_norm_
from geotrain.data import world_tokens
from geotrain.models import GPTConfig, make_model
from geotrain.sim import (
    GradientExchange,
    TrainConfig,
    TrainingConfigError,
    TrainingJob,
    train_compressed,
    train_many,
    worker_gradients,
)

TINY = GPTConfig(n_layer=1, d_model=32, n_head=2)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data():
    return world_tokens(0)


def test_mean_of_worker_gradients_is_the_full_batch_gradient(data):
    model = make_model(TINY, seed=0)
    params = list(model.parameters())
    x, y = data.train[:8 * 97].view(8, 97)[:, :-1], data.train[1:8 * 97 + 1].view(8, 97)[:, :-1]
    grads, losses = worker_gradients(model, params, x, y, 4)
    assert len(grads) == 4 and len(losses) == 4
    full = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()), params)
    torch.testing.assert_close(torch.stack(grads).mean(0), torch.cat([g.reshape(-1) for g in full]))


def test_codec_exchange_averages_and_counts_payload_bytes():
    grads = [torch.randn(1000, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    exchanged = GradientExchange("none", [("g", (1000,))], 4).exchange(grads, step=0)
    torch.testing.assert_close(exchanged.gradient, torch.stack(grads).mean(0))
    assert exchanged.bytes_sent == 4 * 4000
    topk = GradientExchange(get_codec("topk", fraction=0.01), [("g", (1000,))], 4).exchange(grads, step=0)
    assert topk.bytes_sent == 4 * 10 * 8
    assert int((topk.gradient != 0).sum()) <= 40


def test_error_feedback_delays_but_never_loses_gradient():
    exchange = GradientExchange("topk:fraction=0.05", [("g", (200,))], 2, error_feedback=True)
    generator = torch.Generator().manual_seed(0)
    inputs = [[torch.randn(200, generator=generator) for _ in range(2)] for _ in range(6)]
    sent = sum(exchange.exchange(step_grads, step).gradient for step, step_grads in enumerate(inputs))
    residuals = sum(worker["g"] for worker in exchange.state_dict()["residuals"])
    total_in = sum(sum(step_grads) for step_grads in inputs) / 2
    torch.testing.assert_close(sent + residuals / 2, total_in, atol=1e-5, rtol=1e-5)
    restored = GradientExchange("topk", [("g", (200,))], 2, error_feedback=True, fraction=0.05)
    restored.load_state_dict(exchange.state_dict())
    nxt = [torch.randn(200, generator=generator) for _ in range(2)]
    assert torch.equal(restored.exchange(nxt, 6).gradient, exchange.exchange(nxt, 6).gradient)


def test_clip_global_norm():
    flat = torch.full((100,), 0.5)  # norm 5
    assert clip_grad_norm_([flat], 1.0) == pytest.approx(5.0)
    assert float(flat.norm()) == pytest.approx(1.0, rel=1e-5)
    small = torch.full((4,), 0.1)
    clip_grad_norm_([small], 1.0)
    assert torch.equal(small, torch.full((4,), 0.1))


def test_short_run_decreases_loss_and_is_bit_reproducible(data):
    config = TrainConfig(steps=40, workers=4, model=TINY, seed=3)
    first, second = train_compressed(config, data), train_compressed(config, data)
    assert first.losses == second.losses and first.val_bpc == second.val_bpc
    assert len(first.losses) == 40 and first.diverged_at_step is None
    assert sum(first.losses[-5:]) / 5 < sum(first.losses[:5]) / 5 - 0.5
    assert first.val_bpc < math.log2(44) - 1.0
    other = train_compressed(TrainConfig(steps=40, workers=4, model=TINY, seed=4), data)
    assert other.losses != first.losses


def test_fp16_training_tracks_fp32(data):
    fp32 = train_compressed(TrainConfig(steps=30, model=TINY), data)
    fp16 = train_compressed(TrainConfig(codec="fp16", steps=30, model=TINY), data)
    assert fp16.bytes_per_value == 2.0 and fp32.bytes_per_value == 4.0
    assert fp16.val_bpc == pytest.approx(fp32.val_bpc, abs=0.01)
    assert max(abs(a - b) for a, b in zip(fp16.losses, fp32.losses)) < 0.01


@pytest.mark.parametrize(("codec", "params", "bytes_of_n"), [
    ("none", {}, lambda n: 4 * n),
    ("fp16", {}, lambda n: 2 * n),
    ("int8", {}, lambda n: n + 4),
    ("int8-block", {"block_size": 256}, lambda n: n + 4 * math.ceil(n / 256)),
    ("topk", {"fraction": 0.01}, lambda n: 8 * int(0.01 * n)),
    ("sign", {}, lambda n: math.ceil(n / 8) + 4),
])
def test_bytes_per_value_come_from_payload_sizes(data, codec, params, bytes_of_n):
    result = train_compressed(TrainConfig(codec=codec, codec_params=params, steps=2, workers=2, model=TINY), data)
    n = result.n_params
    assert result.bytes_per_value == pytest.approx(bytes_of_n(n) / n, rel=1e-12)
    assert result.total_bytes_sent == 2 * 2 * bytes_of_n(n)
    assert result.traffic_vs_fp32 == pytest.approx(result.bytes_per_value / 4)


def test_divergence_stops_training_and_is_reported(data):
    result = train_compressed(TrainConfig(optimizer="sgd", lr=1e4, clip_norm=None, steps=30, model=TINY), data)
    assert result.diverged_at_step is not None and result.diverged_at_step < 30
    assert len(result.losses) == result.diverged_at_step + 1


def test_config_validation():
    with pytest.raises(TrainingConfigError, match="divisible"):
        TrainConfig(batch=32, workers=5)
    with pytest.raises(TrainingConfigError, match="codec"):
        TrainConfig(codec="zip")
    with pytest.raises(TrainingConfigError, match="optimizer"):
        TrainConfig(optimizer="lion")
    with pytest.raises(TrainingConfigError, match="clip_norm"):
        TrainConfig(clip_norm=0.0)
    with pytest.raises(TrainingConfigError, match="fraction"):
        train_compressed(TrainConfig(codec="topk", codec_params={"fraction": 2.0}, steps=1, model=TINY))
    assert TrainConfig(optimizer="sgd").peak_lr == 0.3 and TrainConfig().peak_lr == 3e-3


@pytest.mark.slow
def test_process_pool_gives_the_same_bits_as_in_process(data):
    jobs = [TrainingJob(TrainConfig(codec=codec, steps=5, workers=2, model=TINY), label=codec)
            for codec in ("none", "sign", "topk")]
    here = train_many(jobs, data, processes=1)
    pooled = train_many(jobs, data, processes=2, threads_per_process=1)
    assert [r.losses for r in here] == [r.losses for r in pooled]
    assert [r.val_bpc for r in here] == [r.val_bpc for r in pooled]


def test_simulated_powersgd_is_the_distributed_algorithm_with_its_bytes(data):
    """`powersgd` in the training loop runs the powersgd reducer (shared P/Q basis), not a per-worker codec."""
    rank = 2
    config = TrainConfig(codec="powersgd", codec_params={"rank": rank}, error_feedback=True, steps=3, workers=2,
                         model=TINY)
    result = train_compressed(config, data)
    model = make_model(TINY, seed=0)
    per_worker = 0
    for param in model.parameters():
        if param.dim() >= 2:
            n, m = param.shape[0], param.numel() // param.shape[0]
            compressed = n * m > 2.0 * rank * (n + m)
            per_worker += 4 * rank * (n + m) if compressed else 4 * n * m
        else:
            per_worker += 4 * param.numel()
    n_values = sum(p.numel() for p in model.parameters())
    assert result.bytes_per_value == pytest.approx(per_worker / n_values, rel=1e-9)
    assert result.bytes_per_value < 4.0
    again = train_compressed(config, data)
    assert again.losses == result.losses
    with pytest.raises(TrainingConfigError, match="powersgd"):
        train_compressed(TrainConfig(codec="powersgd", codec_params={"rank": 0}, steps=1, model=TINY), data)
