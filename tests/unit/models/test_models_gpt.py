"""The tiny GPT: shapes, pipeline-cuttable structure, deterministic init, lr schedule, bits per character."""

import math

import pytest
import torch
from torch import nn

from geotrain.data import world_tokens
from geotrain.models import TINY_2LAYER_GPT, GPTConfig, ModelConfigError, TinyGPT, bits_per_char, lr_at, make_model

SMALL = GPTConfig(n_layer=2, d_model=32, n_head=2, context=16)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_forward_shape_and_equals_embed_blocks_head():
    model = make_model(SMALL, seed=0)
    idx = torch.randint(44, (3, 16), generator=torch.Generator().manual_seed(0))
    logits = model(idx)
    assert logits.shape == (3, 16, 44)
    hidden = model.embed(idx)
    assert hidden.shape == (3, 16, 32)
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == 2
    for block in model.blocks:
        hidden = block(hidden)
    assert torch.equal(model.head(hidden), logits)


def test_causal_prefix_logits_do_not_depend_on_later_tokens():
    model = make_model(SMALL, seed=1)
    a = torch.randint(44, (1, 16), generator=torch.Generator().manual_seed(1))
    b = a.clone()
    b[0, 10:] = (b[0, 10:] + 1) % 44
    torch.testing.assert_close(model(a)[0, :10], model(b)[0, :10])


def test_same_seed_same_weights_global_rng_untouched():
    state = torch.random.get_rng_state()
    a, b, c = make_model(SMALL, seed=3), make_model(SMALL, seed=3), make_model(SMALL, seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if name.endswith("weight") and pa.dim() == 2:
            assert not torch.equal(pa, pc), name


def test_weights_are_untied_by_default_and_tied_on_request():
    model = make_model(SMALL)
    assert model.head.lm.weight.data_ptr() != model.embed.token.weight.data_ptr()
    tied = make_model(GPTConfig(n_layer=1, d_model=32, n_head=2, tie_weights=True))
    assert tied.head.lm.weight is tied.embed.token.weight
    assert tied.num_parameters() == make_model(GPTConfig(n_layer=1, d_model=32, n_head=2)).num_parameters() - 44 * 32


def test_base_config_is_the_demo_model():
    assert TINY_2LAYER_GPT.vocab_size == 44 and TINY_2LAYER_GPT.context == 96 and TINY_2LAYER_GPT.d_model == 128
    assert 2 <= TINY_2LAYER_GPT.n_layer <= 6
    assert 200_000 < TinyGPT(TINY_2LAYER_GPT).num_parameters() < 2_000_000


def test_config_validation():
    with pytest.raises(ModelConfigError, match="divisible"):
        GPTConfig(d_model=30, n_head=4)
    with pytest.raises(ModelConfigError, match="n_layer"):
        GPTConfig(n_layer=0)
    with pytest.raises(ModelConfigError, match="context"):
        make_model(SMALL)(torch.zeros(1, 17, dtype=torch.long))


def test_lr_schedule_values():
    peak = 3e-3
    assert lr_at(0, 300, peak) == pytest.approx(peak / 30)
    assert lr_at(29, 300, peak) == pytest.approx(peak)
    assert lr_at(30, 300, peak) == pytest.approx(peak)
    assert lr_at(299, 300, peak) == pytest.approx(0.1 * peak)
    midpoint = 30 + (299 - 30) / 2
    assert lr_at(int(midpoint), 300, peak) == pytest.approx(0.55 * peak, rel=0.02)
    after = [lr_at(s, 300, peak) for s in range(30, 300)]
    assert all(x >= y for x, y in zip(after, after[1:]))
    assert lr_at(500, 300, peak) == pytest.approx(0.1 * peak)
    assert lr_at(0, 10, 1.0, warmup_steps=0) == pytest.approx(1.0)
    assert lr_at(0, 1, 1.0) == pytest.approx(1.0)


class _Uniform(nn.Module):
    """Predicts every symbol with equal probability: exactly log2(V) bits per character."""

    def __init__(self, context: int) -> None:
        super().__init__()
        self.config = GPTConfig(context=context, n_layer=1, d_model=8, n_head=1)

    def forward(self, idx):
        return torch.zeros(*idx.shape, 44)


def test_bits_per_char_of_a_uniform_predictor_is_log2_vocab_for_any_length():
    for n in (2, 17, 96, 97, 1000, 1001):
        assert bits_per_char(_Uniform(16), torch.zeros(n, dtype=torch.long)) == pytest.approx(math.log2(44))


def test_bits_per_char_counts_each_target_once():
    model = make_model(SMALL, seed=0)
    tokens = torch.randint(44, (16 * 5 + 8,), generator=torch.Generator().manual_seed(2))
    expected = 0.0
    for start in range(0, tokens.numel() - 1, 16):
        window = tokens[start:start + 17]
        with torch.no_grad():
            logits = model(window[None, :-1])[0]
        expected += torch.nn.functional.cross_entropy(logits, window[1:], reduction="sum").item()
    assert bits_per_char(model, tokens, batch_size=2) == pytest.approx(expected / ((tokens.numel() - 1) * math.log(2)))


def test_untrained_model_scores_about_log2_vocab_deterministically():
    val = world_tokens(0).val
    model = make_model(TINY_2LAYER_GPT, seed=0)
    bpc = bits_per_char(model, val[:4000])
    assert bpc == pytest.approx(math.log2(44), abs=0.3)
    assert bits_per_char(model, val[:4000]) == bpc
    assert model.training  # mode restored
