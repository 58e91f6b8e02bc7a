"""load_model_spec: tiny, user files and modules (errors included), the shared loss, tied gradients across stages."""

from __future__ import annotations

import copy
import os
import sys
import textwrap

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from geotrain.errors import GeotrainError
from geotrain.models import (
    LayerModel,
    LayerModelError,
    ModelOptions,
    ModelSpecError,
    all_reduce_tied_gradients,
    even_boundaries,
    lm_loss,
    load_model_spec,
    make_model,
    run_layers,
    stage_ties,
    sum_tied_gradients,
)
from geotrain.models.gpt import GPTConfig

USER_MODEL = '''
import torch
from torch import nn


class Embed(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)

    def forward(self, ids):
        return self.emb(ids)


class Head(nn.Module):
    def __init__(self, embed, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, embed.emb.num_embeddings, bias=False)
        self.out.weight = embed.emb.weight  # tied input/output embedding

    def forward(self, hidden):
        return self.out(self.norm(hidden))


def mlp(dim):
    return nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))


def build():
    embed = Embed(64, 16)
    return nn.Sequential(embed, mlp(16), mlp(16), mlp(16), Head(embed, 16))


def as_list():
    return [nn.Embedding(10, 4), nn.Linear(4, 10)]


def wrong_type():
    return {"layers": 3}


def wrong_items():
    return [nn.Embedding(10, 4), "not a module"]


def raises():
    raise RuntimeError("boom")


NOT_A_FUNCTION = 3
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(USER_MODEL)
    return path


def test_tiny_spec_is_the_tiny_gpt_as_layers():
    options = ModelOptions(seed=4, vocab_size=256, n_layer=3, context=32)
    model = load_model_spec("tiny", options)
    gpt = make_model(GPTConfig(vocab_size=256, n_layer=3, context=32), seed=4)  # the "tiny" preset: 4x MLP
    tokens = torch.randint(256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.as_module()(tokens), gpt(tokens))
        stages = [copy.deepcopy(s) for s in model.stage_modules((0, 2, 5))]
        assert torch.equal(run_layers(stages, tokens), gpt(tokens))
    assert (model.n_layers, model.vocab_size, model.context, model.hidden_size) == (5, 256, 32, 128)
    assert model.num_parameters() == gpt.num_parameters() == int(model.layer_parameter_counts().sum())


def test_user_file_model_is_seeded_and_its_tie_is_found(user_file):
    model = load_model_spec(f"{user_file}:build", ModelOptions(seed=1))
    again = load_model_spec(f"{user_file}:build", ModelOptions(seed=1))
    other = load_model_spec(f"{user_file}:build", ModelOptions(seed=2))
    first = [p for p in model.as_module().parameters()]
    assert all(torch.equal(a, b) for a, b in zip(first, again.as_module().parameters()))
    assert not torch.equal(first[0], next(other.as_module().parameters()))
    assert (model.n_layers, model.vocab_size) == (5, 64)
    (tie,) = model.tied_weights
    assert tie.places == ((0, "emb.weight"), (4, "out.weight"))
    assert model.num_parameters() < int(model.layer_parameter_counts().sum())  # counted once, held twice


def test_module_function_spec_and_list_return(user_file, monkeypatch):
    monkeypatch.syspath_prepend(str(user_file.parent))
    model = load_model_spec("my_model:as_list")
    assert model.n_layers == 2 and model.vocab_size == 10
    sys.modules.pop("my_model", None)


@pytest.mark.parametrize("suffix, message", [
    ("missing.py:build", "file 'MISSING' not found"),
    ("FILE:nope", "has no function 'nope'"),
    ("FILE:NOT_A_FUNCTION", "is a int, not a function"),
    ("FILE:wrong_type", "must return an nn.Sequential, a non-empty list of nn.Modules or a LayerModel, got dict"),
    ("FILE:wrong_items", "got list of \\['Embedding', 'str'\\]"),
    ("FILE:raises", "raises\\(\\) raised RuntimeError: boom"),
    ("no_such_module_xyz:build", "cannot import module 'no_such_module_xyz'"),
    ("justaword", "expected tiny, hf:SPEC"),
    ("FILE:", "expected tiny, hf:SPEC"),
])
def test_user_model_errors_name_the_spec_and_the_cause(user_file, suffix, message):
    spec = suffix.replace("FILE", str(user_file)).replace("missing.py", str(user_file.parent / "missing.py"))
    message = message.replace("MISSING", str(user_file.parent / "missing.py"))
    with pytest.raises(ModelSpecError, match=message) as info:
        load_model_spec(spec)
    assert isinstance(info.value, GeotrainError) and "\n" not in str(info.value)


def test_a_user_file_that_fails_to_import_is_reported(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("import no_such_package_abc\n")
    with pytest.raises(ModelSpecError, match="importing .*bad.py raised ModuleNotFoundError"):
        load_model_spec(f"{path}:build")


def test_layer_model_checks_layers_and_boundaries():
    with pytest.raises(LayerModelError, match="layer list is empty"):
        LayerModel("x", ())
    model = LayerModel("x", (nn.Linear(2, 2), nn.Linear(2, 2)))
    with pytest.raises(LayerModelError, match="rise strictly from 0 to 2"):
        model.stage_modules((0, 2, 2))
    with pytest.raises(LayerModelError, match="stage 2 outside 0..1"):
        model.stage_module((0, 1, 2), 2)
    with pytest.raises(LayerModelError, match="cannot cut 2 layers into 3 stages"):
        even_boundaries(2, 3)


def test_lm_loss_is_mean_cross_entropy_in_nats():
    logits = torch.zeros(2, 3, 8)  # uniform over 8 tokens
    assert lm_loss(logits, torch.zeros(2, 3, dtype=torch.long)).item() == pytest.approx(torch.log(torch.tensor(8.0)).item())


def test_summed_tied_gradients_on_separate_stage_copies_equal_the_unsplit_gradients(user_file):
    model = load_model_spec(f"{user_file}:build", ModelOptions(seed=0))
    cuts = (0, 2, 3, 5)
    shared = model.stage_modules(cuts)
    ranks = [copy.deepcopy(stage) for stage in shared]  # each rank holds its own copy of the tied weight
    tokens = torch.randint(64, (4, 13), generator=torch.Generator().manual_seed(1))
    lm_loss(model.as_module()(tokens[:, :-1]), tokens[:, 1:]).backward()
    lm_loss(run_layers(ranks, tokens[:, :-1]), tokens[:, 1:]).backward()
    ties = stage_ties(model.tied_weights, cuts, model.n_layers)
    assert [t.names for t in ties] == [((0, "0.emb.weight"), (2, "1.out.weight"))]
    first, last = ranks[0].get_parameter("0.emb.weight"), ranks[2].get_parameter("1.out.weight")
    assert not torch.allclose(first.grad, shared[0].get_parameter("0.emb.weight").grad)
    sum_tied_gradients({0: ranks[0], 2: ranks[2]}, ties)
    for original, copied in zip(shared, ranks):
        for p_ref, p_copy in zip(original.parameters(), copied.parameters()):
            torch.testing.assert_close(p_copy.grad, p_ref.grad, rtol=0, atol=1e-7)
    assert torch.equal(first.grad, last.grad)
    with pytest.raises(LayerModelError, match="no module given for stage"):
        sum_tied_gradients({0: ranks[0]}, ties)


def _tied_worker(rank: int, port: int, user_file: str, queue) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = load_model_spec(f"{user_file}:build", ModelOptions(seed=0))
        cuts = (0, 3, 5)
        stage = rank  # rank 0 holds stage 0, rank 1 the last stage, as two pipeline ranks of one replica
        module = model.stage_module(cuts, stage)
        tokens = torch.randint(64, (4, 13), generator=torch.Generator().manual_seed(1))
        hidden = model.stage_module(cuts, 0)(tokens[:, :-1]).detach().requires_grad_()
        if stage == 0:
            out = module(tokens[:, :-1])
            grad = torch.empty_like(out)
            dist.recv(grad, src=1)
            out.backward(grad)
        else:
            lm_loss(module(hidden), tokens[:, 1:]).backward()
            dist.send(hidden.grad, dst=0)
        ties = stage_ties(model.tied_weights, cuts, model.n_layers)
        all_reduce_tied_gradients(module, stage, ties, group=dist.group.WORLD)
        # a numpy copy travels by value: a torch tensor's storage travels as a file descriptor, which is
        # gone if this process exits before the parent has read it (multiprocessing's resource sharer)
        queue.put((rank, module.get_parameter(ties[0].name_in(stage)).grad.detach().clone().numpy()))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_all_reduce_tied_gradients_over_gloo_equals_the_unsplit_gradient(user_file):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_tied_worker, args=(rank, port, str(user_file), queue)) for rank in range(2)]
    for proc in procs:
        proc.start()
    try:
        grads = {rank: torch.from_numpy(grad) for rank, grad in (queue.get(timeout=90) for _ in procs)}
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    model = load_model_spec(f"{user_file}:build", ModelOptions(seed=0))
    tokens = torch.randint(64, (4, 13), generator=torch.Generator().manual_seed(1))
    lm_loss(model.as_module()(tokens[:, :-1]), tokens[:, 1:]).backward()
    shared = model.layers[0].emb.weight.grad
    torch.testing.assert_close(grads[0], shared, rtol=0, atol=1e-7)
    assert torch.equal(grads[0], grads[1])
    assert all(proc.exitcode == 0 for proc in procs)


def test_hf_specs_without_transformers_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(ModelSpecError, match="needs transformers \\(pip install 'geotrain\\[hf\\]'"):
        load_model_spec("hf:gpt2-tiny")
