"""Hugging Face causal LMs as layer lists: staged == unsplit (logits and gradients), tied weights, local files."""

from __future__ import annotations

import copy
import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf: adapter needs the optional extra geotrain[hf]")

from geotrain.models import (  # noqa: E402
    ModelOptions,
    ModelSpecError,
    even_boundaries,
    lm_loss,
    load_model_spec,
    run_layers,
    stage_ties,
    sum_tied_gradients,
)
from geotrain.models.hf import PRESETS, build_hf_causal_lm, layers_of_hf_model  # noqa: E402

FAMILIES = ["gpt2-tiny", "llama-tiny", "qwen2-tiny", "mistral-tiny"]


def _tokens(vocab: int, batch: int = 2, seq: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.randint(vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(seed))


def _split_as_ranks(hf_model, stages: int):
    """Stage modules that share the HF model's parameters, and separate copies of them (as on separate ranks)."""
    layer_model = layers_of_hf_model(hf_model, "test")
    cuts = even_boundaries(layer_model.n_layers, stages)
    shared = layer_model.stage_modules(cuts)
    return layer_model, cuts, shared, [copy.deepcopy(stage) for stage in shared]


@pytest.mark.parametrize("preset", FAMILIES)
@pytest.mark.parametrize("stages", [2, 3])
def test_stages_in_sequence_equal_the_hf_forward_and_backward(preset, stages):
    hf_model = build_hf_causal_lm(f"hf:{preset}", preset, ModelOptions(seed=3))
    layer_model, cuts, shared, ranks = _split_as_ranks(hf_model, stages)
    tokens = _tokens(layer_model.vocab_size)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    reference = hf_model(inputs).logits
    lm_loss(reference, targets).backward()
    staged = run_layers(ranks, inputs)
    assert torch.equal(staged, reference)  # max |diff| = 0, not merely close
    lm_loss(staged, targets).backward()
    ties = stage_ties(layer_model.tied_weights, cuts, layer_model.n_layers)
    sum_tied_gradients(dict(enumerate(ranks)), ties)

    worst = 0.0
    for original, copied in zip(shared, ranks):
        for (name, p_ref), (_, p_copy) in zip(original.named_parameters(), copied.named_parameters()):
            worst = max(worst, (p_ref.grad - p_copy.grad).abs().max().item())
    assert worst <= 1e-6, worst


def test_gpt2_ties_wte_and_lm_head_across_first_and_last_stage():
    model = load_model_spec("hf:gpt2-tiny")
    (tie,) = model.tied_weights
    assert tie.layers == (0, model.n_layers - 1)
    (crossing,) = stage_ties(model.tied_weights, even_boundaries(model.n_layers, 2), model.n_layers)
    assert crossing.stages == (0, 1)
    assert crossing.name_in(0) == "0.wte.weight" and crossing.name_in(1) == "2.lm_head.weight"
    assert stage_ties(model.tied_weights, (0, model.n_layers), model.n_layers) == ()  # one stage: one parameter
    assert load_model_spec("hf:llama-tiny").tied_weights == ()


def test_without_summing_the_tied_gradient_the_copies_differ_from_the_shared_weight():
    hf_model = build_hf_causal_lm("hf:gpt2-tiny", "gpt2-tiny", ModelOptions(seed=0))
    layer_model, cuts, shared, ranks = _split_as_ranks(hf_model, 2)
    tokens = _tokens(layer_model.vocab_size)
    lm_loss(hf_model(tokens[:, :-1]).logits, tokens[:, 1:]).backward()
    lm_loss(run_layers(ranks, tokens[:, :-1]), tokens[:, 1:]).backward()
    shared_grad = hf_model.transformer.wte.weight.grad
    first, last = ranks[0].get_parameter("0.wte.weight").grad, ranks[1].get_parameter("2.lm_head.weight").grad
    assert not torch.allclose(first, shared_grad) and not torch.allclose(last, shared_grad)
    torch.testing.assert_close(first + last, shared_grad, rtol=0, atol=1e-6)


def test_presets_config_json_and_config_dir_build_the_same_weights(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(PRESETS["llama-tiny"]))
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "config.json").write_text(config.read_text())
    models = [load_model_spec(spec, ModelOptions(seed=5))
              for spec in ("hf:llama-tiny", f"hf:{config}", f"hf:{tmp_path / 'dir'}")]
    states = [m.as_module().state_dict() for m in models]
    for state in states[1:]:
        assert all(torch.equal(state[k], states[0][k]) for k in states[0])
    other = load_model_spec("hf:llama-tiny", ModelOptions(seed=6)).as_module().state_dict()
    assert not torch.equal(other["0.weight"], states[0]["0.weight"])


def test_local_model_directory_loads_its_saved_weights(tmp_path):
    hf_model = build_hf_causal_lm("hf:gpt2-tiny", "gpt2-tiny", ModelOptions(seed=9))
    hf_model.save_pretrained(tmp_path)
    loaded = load_model_spec(f"hf:{tmp_path}", ModelOptions(seed=123))  # seed ignored: weights come from disk
    tokens = _tokens(256)[:, :-1]
    with torch.no_grad():
        assert torch.equal(loaded.as_module()(tokens), hf_model(tokens).logits)
    assert len(loaded.tied_weights) == 1


def test_options_override_vocab_depth_and_context():
    model = load_model_spec("hf:gpt2-tiny", ModelOptions(vocab_size=300, n_layer=2, context=64))
    assert (model.n_layers, model.vocab_size, model.context, model.hidden_size) == (4, 300, 64, 64)
    with pytest.raises(Exception, match="longer than the model's 64 positions"):
        model.layers[0](torch.zeros(1, 65, dtype=torch.long))


@pytest.mark.parametrize("spec, message", [
    ("hf:no-such-preset", "neither a config.json, a local model directory nor a preset"),
    ("hf:", "name a preset"),
])
def test_unresolvable_hf_specs_say_why(spec, message):
    with pytest.raises(ModelSpecError, match=message):
        load_model_spec(spec)


def test_unsupported_family_and_bad_config_json_are_refused(tmp_path):
    bert = tmp_path / "bert.json"
    bert.write_text(json.dumps({"model_type": "bert", "hidden_size": 64}))
    with pytest.raises(ModelSpecError, match="model_type 'bert' is not supported"):
        load_model_spec(f"hf:{bert}")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ModelSpecError, match="cannot read"):
        load_model_spec(f"hf:{broken}")
    typeless = tmp_path / "typeless.json"
    typeless.write_text("{}")
    with pytest.raises(ModelSpecError, match="model_type: missing"):
        load_model_spec(f"hf:{typeless}")


def test_stage_io_shapes_give_pipelining_its_example_shapes():
    model = load_model_spec("hf:llama-tiny")
    shapes = model.stage_io_shapes(even_boundaries(model.n_layers, 3), batch=2, seq_len=8)
    assert [s[:2] for s in shapes] == [((2, 8), (2, 8, 64)), ((2, 8, 64), (2, 8, 64)), ((2, 8, 64), (2, 8, 256))]


SENTENCE_WORDS = ("the", "cat", "dog", "sat", "ran", "on", "under", "a", "mat", "tree", "and", "slept", "quickly")


def _story(seed: int, sentences: int) -> str:
    rng = torch.Generator().manual_seed(seed)
    words = [SENTENCE_WORDS[int(i)] for i in torch.randint(len(SENTENCE_WORDS), (sentences * 6,), generator=rng)]
    return ". ".join(" ".join(words[i:i + 6]) for i in range(0, len(words), 6)) + ".\n"


from user_models import USER_GPT  # noqa: E402  (a tied-embedding model in a user file)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["hf:gpt2-tiny", "USER_FILE:build"])
def test_two_stage_training_on_a_local_text_file_lowers_validation_loss(tmp_path, spec, one_torch_thread):
    from geotrain.data import load_corpus, prepare_token_file, replica_batch
    from geotrain.models import validation_loss

    (tmp_path / "story.txt").write_text(_story(0, 600))
    prepare_token_file(tmp_path / "story.txt", tmp_path / "story.bin", val_fraction=0.1)
    corpus = load_corpus(tmp_path / "story.bin")
    (tmp_path / "user_gpt.py").write_text(USER_GPT)
    model = load_model_spec(spec.replace("USER_FILE", str(tmp_path / "user_gpt.py")), ModelOptions(seed=0))
    corpus.check_vocab(model.vocab_size)
    seq_len, steps = 64, 30
    corpus.check_seq_len(seq_len)
    cuts = even_boundaries(model.n_layers, 2)
    ranks = [copy.deepcopy(stage) for stage in model.stage_modules(cuts)]  # one copy per pipeline rank
    ties = stage_ties(model.tied_weights, cuts, model.n_layers)
    assert len(ties) == 1  # both models tie the embedding to the head across the cut
    optimizers = [torch.optim.AdamW(stage.parameters(), lr=3e-3) for stage in ranks]

    before = validation_loss(ranks, corpus.val, seq_len)
    for step in range(steps):
        x, y = replica_batch(corpus.train, seed=0, step=step, replica=0, replicas=1, global_batch=8, seq_len=seq_len)
        lm_loss(run_layers(ranks, x), y).backward()
        sum_tied_gradients(dict(enumerate(ranks)), ties)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    after = validation_loss(ranks, corpus.val, seq_len)

    print(f"{spec}: validation loss {before:.3f} -> {after:.3f} nats after {steps} steps")
    assert after < before - 1.0
    (tie,) = ties
    assert torch.equal(ranks[0].get_parameter(tie.name_in(0)), ranks[1].get_parameter(tie.name_in(1)))
