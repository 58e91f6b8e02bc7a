"""OneBitAdam in one process: AdamW during warm-up, exact 1-bit messages, error compensation, bytes, state."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.models import GPTConfig, make_model
from geotrain.comm import OneBitLayout, SimulatedCollective
from geotrain.optim import OneBitAdam, OneBitAdamError

TINY = GPTConfig(n_layer=1, d_model=32, n_head=2, context=16)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors: faster, and bit-reproducible


def _loss(model, generator, rows=4):
    """Next-token loss on a learnable text: each row counts up (mod vocab) from a random start."""
    starts = torch.randint(0, TINY.vocab_size, (rows, 1), generator=generator)
    x = (starts + torch.arange(TINY.context + 1)) % TINY.vocab_size
    return torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())


def _worker_grads(model, generator, workers):
    grads = []
    for _ in range(workers):
        model.zero_grad()
        _loss(model, generator).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return grads


def test_warmup_is_adamw_bit_for_bit():
    reference, model = make_model(TINY, 0), make_model(TINY, 0)
    adamw = torch.optim.AdamW(reference.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    onebit = OneBitAdam(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, warmup_steps=100)
    for seed in range(5):
        for net, opt in ((reference, adamw), (model, onebit)):
            opt.zero_grad()
            _loss(net, torch.Generator().manual_seed(seed)).backward()
            opt.step()
    for a, b in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=6), world=st.integers(1, 5), seed=st.integers(0, 99))
def test_chunk_message_keeps_signs_and_segment_mean_magnitudes(sizes, world, seed):
    layout = OneBitLayout(sizes, world)
    assert layout.chunk_numel % 32 == 0 and layout.padded_numel >= layout.numel
    x = layout.pad(torch.randn(layout.numel, generator=torch.Generator().manual_seed(seed)) * 3)
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    for j in range(world):
        chunk = layout.chunk(x, j)
        message, decoded = layout.encode_chunk(chunk, j)
        assert message.dtype == torch.uint8 and message.numel() == layout.message_bytes
        assert torch.equal(layout.decode_chunk(message, j), decoded)
        lo = j * layout.chunk_numel
        real = max(0, min(layout.numel - lo, layout.chunk_numel))
        assert torch.all(decoded[real:] == 0)  # padding carries nothing
        assert torch.all((decoded[:real] >= 0) == (chunk[:real] >= 0))
        # each piece of a parameter inside the chunk decodes to +-(its own mean |x|)
        cuts = sorted({lo, lo + real} | {s for s in starts if lo < s < lo + real})
        for a, b in zip(cuts[:-1], cuts[1:], strict=False):
            piece = chunk[a - lo:b - lo]
            assert torch.allclose(decoded[a - lo:b - lo].abs(), piece.abs().mean().expand(b - a), rtol=1e-5)


@pytest.mark.parametrize("world", [1, 3, 4])
def test_error_compensation_loses_nothing_over_many_steps(world):
    # sum of averaged momenta sent == sum of true means, minus what still sits in the residuals
    model = make_model(TINY, 0)
    opt = OneBitAdam(model.parameters(), warmup_steps=1, collective=SimulatedCollective(world))
    layout, generator = opt.layout, torch.Generator().manual_seed(3)
    sent, true = torch.zeros(layout.numel), torch.zeros(layout.numel)
    for _ in range(25):
        momenta = [torch.randn(layout.numel, generator=generator) * 0.01 for _ in range(world)]
        averaged, residuals = opt.reducer.average(momenta, opt.collective)
        opt.reducer.commit(residuals)  # as step_workers does
        sent += averaged
        true += sum(momenta) / world
    pending = sum(opt.worker_errors) / world
    pending[: layout.numel] += torch.cat([opt.server_errors[j] for j in range(world)])[: layout.numel]
    assert torch.allclose(sent + pending[: layout.numel], true, atol=1e-5)
    # and the residuals stay bounded (they do not grow with the step count)
    assert float(pending.abs().max()) < 0.1


def test_bytes_counted_equal_bytes_declared_and_compression_is_over_25x():
    workers = 4
    model = make_model(TINY, 0)
    opt = OneBitAdam(model.parameters(), warmup_steps=2, collective=SimulatedCollective(workers))
    generator = torch.Generator().manual_seed(0)
    counted = []
    for _ in range(4):
        before = opt.ledger.handed_bytes
        opt.step_workers(_worker_grads(model, generator, workers))
        counted.append(opt.ledger.handed_bytes - before)
    n = opt.layout.numel
    assert counted[:2] == [4 * n, 4 * n] == [opt.declared_step_bytes(False)] * 2
    assert counted[2:] == [opt.declared_step_bytes(True)] * 2
    assert opt.declared_step_bytes(True) == (workers + 1) * (opt.layout.chunk_numel // 8 + 4 * opt.layout.max_segments)
    assert opt.ledger.calls == {"all_reduce": 2, "all_to_all": 2, "all_gather": 2}
    # The demo model (0.8 M values, 50 tensors): ~32 / (1 + 1/p) = 25.6x less than fp32, scales included.
    base = OneBitLayout([p.numel() for p in make_model(GPTConfig(), 0).parameters()], workers)
    assert 25.0 < 4 * base.numel / ((workers + 1) * base.message_bytes) < 25.6


def test_frozen_variance_and_identical_models_on_every_worker():
    workers = 3
    model = make_model(TINY, 0)
    opt = OneBitAdam(model.parameters(), lr=1e-3, warmup_steps=3, collective=SimulatedCollective(workers))
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        opt.step_workers(_worker_grads(model, generator, workers))
    frozen = opt.exp_avg_sq.clone()
    losses = []
    for _ in range(6):
        opt.step_workers(_worker_grads(model, generator, workers))
        losses.append(_loss(model, torch.Generator().manual_seed(99)).item())
    assert opt.frozen and torch.equal(opt.exp_avg_sq, frozen)
    assert losses[-1] < losses[0]  # the compressed stage still trains


def test_state_dict_restores_residuals_and_frozen_variance_exactly():
    workers = 2

    def fresh():
        model = make_model(TINY, 0)
        return model, OneBitAdam(model.parameters(), lr=2e-3, warmup_steps=2, collective=SimulatedCollective(workers))

    model, opt = fresh()
    generator = torch.Generator().manual_seed(5)
    for _ in range(4):
        opt.step_workers(_worker_grads(model, generator, workers))
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    saved_generator = generator.get_state()
    for _ in range(3):
        opt.step_workers(_worker_grads(model, generator, workers))

    resumed_model, resumed_opt = fresh()
    resumed_model.load_state_dict(saved_model)
    resumed_opt.load_state_dict(saved_opt)
    assert any(float(e.abs().sum()) > 0 for e in resumed_opt.worker_errors)
    generator.set_state(saved_generator)
    for _ in range(3):
        resumed_opt.step_workers(_worker_grads(resumed_model, generator, workers))
    for a, b in zip(model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_state_of_other_ranks_or_models_is_refused():
    model = make_model(TINY, 0)
    state = OneBitAdam(model.parameters(), collective=SimulatedCollective(2)).state_dict()
    with pytest.raises(OneBitAdamError, match="residuals belong to their rank"):
        OneBitAdam(model.parameters(), collective=SimulatedCollective(3)).load_state_dict(state)
    with pytest.raises(OneBitAdamError, match="not a OneBitAdam state dict"):
        OneBitAdam(model.parameters()).load_state_dict(torch.optim.AdamW(model.parameters()).state_dict())


def test_bad_arguments_are_named():
    params = make_model(TINY, 0).parameters()
    with pytest.raises(OneBitAdamError, match=r"warmup_steps .*must be an integer >= 1, got 0"):
        OneBitAdam(params, warmup_steps=0)
    model = make_model(TINY, 0)
    opt = OneBitAdam(model.parameters(), collective=SimulatedCollective(2))
    with pytest.raises(OneBitAdamError, match="call step_workers"):
        opt.step()


def test_as_update_rule_of_the_training_loop_warmup_reproduces_adamw_exactly():
    from geotrain.optim import onebit_update_rule
    from geotrain.sim import TrainConfig, train_compressed

    config = TrainConfig(model=TINY, steps=5, workers=2, batch=4)
    adamw = train_compressed(config)
    onebit = train_compressed(config, update_rule=onebit_update_rule(warmup_steps=100))
    assert onebit.losses == adamw.losses and onebit.val_bpc == adamw.val_bpc
    assert onebit.total_bytes_sent == adamw.total_bytes_sent  # fp32 averaging: 4 bytes per value per worker


def test_variance_floor_lifts_values_that_never_had_a_gradient():
    models = [make_model(TINY, 0), make_model(TINY, 0)]
    floored, plain = (OneBitAdam(m.parameters(), warmup_steps=2, variance_floor=f) for m, f in zip(models, (0.1, 0.0)))
    for seed in range(2):
        for model, opt in zip(models, (floored, plain)):
            opt.zero_grad()
            _loss(model, torch.Generator().manual_seed(seed)).backward()
            model.embed.token.weight.grad[7] = 0.0  # a character never seen during the warm-up
            opt.step()
    assert floored.frozen and plain.frozen
    offset = 0
    for param in models[0].parameters():
        v_plain = plain.exp_avg_sq[offset:offset + param.numel()]
        v_floored = floored.exp_avg_sq[offset:offset + param.numel()]
        offset += param.numel()
        floor = 0.1 * float(v_plain.sqrt().mean())
        assert torch.equal(v_floored, v_plain.clamp(min=floor * floor))
    row = plain.exp_avg_sq[7 * TINY.d_model:8 * TINY.d_model]
    assert float(row.max()) == 0.0  # without the floor the update of that row would divide by eps
    assert float(floored.exp_avg_sq[7 * TINY.d_model:8 * TINY.d_model].min()) > 0.0
    with pytest.raises(OneBitAdamError, match="variance_floor"):
        OneBitAdam(make_model(TINY, 0).parameters(), variance_floor=2.0)
