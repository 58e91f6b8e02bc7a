"""`geotrain train` on your model and your data: a tiny HF GPT-2 and a user-file model (both with tied
embeddings), 2 stages x 2 replicas on a local text file, under torch.distributed.pipelining schedules.
Real worker processes (the launcher's fork server, here with transformers imported once), gloo, hard timeouts."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from geotrain.cluster import make_network
from geotrain.models import even_boundaries, lm_loss, load_model_spec, validation_loss
from geotrain.runtime import CheckpointError, RuntimeConfig, launch
from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime.launcher import check_resumable
from geotrain.runtime.stages import stage_modules
from geotrain.runtime.training_data import load_training_data
from user_models import USER_GPT

pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(300)

CLUSTER = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0, name="test-2x2")
ASSIGNMENT = np.array([[0, 1], [2, 3]])  # each pipeline across the regions
WORDS = "the cat dog sat ran on under a mat tree and slept quickly over big small red blue".split()


HF_IMPORTS = ("transformers", "transformers.models.auto.modeling_auto", "transformers.models.gpt2.modeling_gpt2",
              "transformers.masking_utils")
"""What a worker building hf:gpt2-tiny imports (about 2.5 s of CPU each, 4 workers a launch, 8 launches here)."""


@pytest.fixture(scope="module", autouse=True)
def fork_server_with_transformers():
    """This module's workers fork from a server that has imported transformers as well as the launcher's list
    (which counts only for the first server of a process, so any running server is stopped first and after):
    the same workers and code, without each one importing transformers again."""
    from multiprocessing import forkserver

    from geotrain.comm.launch import FORKSERVER_PRELOAD
    from geotrain.procs import forkserver_context

    forkserver._forkserver._stop()  # noqa: SLF001 - the stdlib's own way for tests to stop the server
    forkserver_context([*FORKSERVER_PRELOAD, *HF_IMPORTS])
    yield
    forkserver._forkserver._stop()  # noqa: SLF001 - the next launch starts one with its own list


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(10)) + "." for _ in range(3000)))
    return path


@pytest.fixture(scope="module")
def user_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("model") / "my_model.py"
    path.write_text(USER_GPT)
    return f"{path}:build"


def _config(model: str, data: Path, **options) -> RuntimeConfig:
    options = {"steps": 4, "batch_size": 4, "microbatches": 2, "seq_len": 32, "lr": 3e-3, "time_scale": 0.0,
               "heartbeat_timeout_s": 20.0, "eval_every": 2, "eval_windows": 16, **options}
    return RuntimeConfig.of(cluster=CLUSTER, assignment=ASSIGNMENT, model_name=model, data=str(data), **options)


def _run(model: str, data: Path, **options):
    return launch(_config(model, data, **options)).report


def _unsplit_step0(model_spec: str, config: RuntimeConfig) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of the unsplit model on step 0's global batch (both replicas' windows)."""
    model = load_model_spec(model_spec).as_module()
    data = load_training_data(config.data.data, config.data.data_seed, config.data.val_fraction)
    batches = [data.batch(config.data.data_seed, 0, r, config.replicas, config.schedule.batch_size, config.sequence_length)
               for r in range(config.replicas)]
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    loss = lm_loss(model(x), y)
    loss.backward()
    return float(loss.detach()), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("spec", [pytest.param("hf:gpt2-tiny", marks=pytest.mark.slow), "user"])
def test_staged_run_has_the_unsplit_models_loss_and_gradients_and_keeps_ties_tied(spec, text_file, user_model,
                                                                                   tmp_path):
    spec = user_model if spec == "user" else spec
    config = _config(spec, text_file, steps=1, eval_every=1, checkpoint_dir=str(tmp_path))
    report = launch(config).report
    loss, grads = _unsplit_step0(spec, config)
    assert report.losses[0] == pytest.approx(loss, rel=1e-5)  # the pipeline's forward is the unsplit forward
    step = ckpt.latest_step(tmp_path)
    manifest = ckpt.read_manifest(tmp_path, step)
    model = load_model_spec(spec)
    cuts = even_boundaries(model.n_layers, 2)  # the run's split (equal layer counts)
    for stage in range(2):
        shard = ckpt.load_shard(tmp_path, step, stage * 2, manifest, {"rank": stage * 2, "stage": stage, "replica": 0})
        names = [n for n, _ in model.stage_module(cuts, stage).named_parameters()]
        unsplit = {id(p): n for n, p in model.as_module().named_parameters()}
        params = list(model.stage_module(cuts, stage).parameters())
        moments = shard["dp"]["optimizer"]["state"]
        assert len(moments) == len(names)
        for index, param in enumerate(params):
            # AdamW's first moment after one step is (1 - beta1) x the gradient it was given: the
            # DP-averaged, tie-summed pipeline gradient must be the unsplit model's full-batch gradient.
            grad = grads[unsplit[id(param)]]
            torch.testing.assert_close(moments[index]["exp_avg"] / 0.1, grad, rtol=1e-4, atol=1e-7)
    # the tied embedding / output weight: same values on stage 0 and stage 1 after the update
    first = ckpt.load_shard(tmp_path, step, 0, manifest, {"rank": 0, "stage": 0, "replica": 0})["stage"]
    last = ckpt.load_shard(tmp_path, step, 2, manifest, {"rank": 2, "stage": 1, "replica": 0})["stage"]
    (first_layer, first_name), (last_layer, last_name) = model.tied_weights[0].places
    assert first_layer < cuts[1] <= last_layer  # the tie crosses the cut
    assert torch.equal(first[f"0.layers.{first_layer}.{first_name}"], last[f"0.layers.{last_layer - cuts[1]}.{last_name}"])
    assert report.replicas_in_sync
    # the validation loss the pipeline measured (windows shared out by replica, sums all-reduced) is the
    # unsplit evaluation of the trained weights
    stages = stage_modules(model, cuts, [0, 1])
    for stage, shard in ((0, first), (1, last)):
        stages[stage].load_state_dict({key.removeprefix("0."): value for key, value in shard.items()})
    data = load_training_data(config.data.data, config.data.data_seed, config.data.val_fraction)
    expected = validation_loss([stages[0], stages[1]], data.val, config.sequence_length, max_windows=config.data.eval_windows)
    assert report.validation == ((1, pytest.approx(expected, rel=1e-5)),)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["hf:gpt2-tiny", "user"])
def test_validation_loss_falls_and_resume_equals_uninterrupted(spec, text_file, user_model, tmp_path):
    spec = user_model if spec == "user" else spec
    options = {"steps": 6, "eval_every": 2, "time_scale": 0.01}
    uninterrupted = _run(spec, text_file, **options)
    _run(spec, text_file, **options, stop_after=3, checkpoint_dir=str(tmp_path))
    resumed = _run(spec, text_file, **options, resume=True, checkpoint_dir=str(tmp_path))
    assert resumed.losses == uninterrupted.losses  # bit for bit
    assert [step for step, _ in uninterrupted.validation] == [2, 4, 6]
    validation = [loss for _, loss in uninterrupted.validation]
    assert validation[-1] < validation[0] - 0.3, validation
    assert resumed.validation[-1] == uninterrupted.validation[-1]
    assert uninterrupted.pp_bytes_per_cut == 2 * 32 * 64 * 4 * 2  # 2 micro-batches of 2 x 32 x 64 fp32
    with pytest.raises(CheckpointError, match="model is"):  # another model: refused before any worker starts
        check_resumable(_config("hf:llama-tiny", text_file, **options, resume=True, checkpoint_dir=str(tmp_path)))
    other = tmp_path / "other.txt"
    other.write_text(text_file.read_text()[::-1])
    with pytest.raises(CheckpointError, match="data is"):
        check_resumable(_config(spec, other, **options, resume=True, checkpoint_dir=str(tmp_path)))


@pytest.mark.slow
def test_gpipe_1f1b_interleaved_1f1b_and_looped_bfs_give_the_same_losses(text_file):
    runs = {schedule: _run("hf:gpt2-tiny", text_file, steps=3, schedule=schedule, microbatches=2)
            for schedule in ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs")}
    for schedule, report in runs.items():
        assert report.losses == pytest.approx(runs["gpipe"].losses, rel=1e-5), schedule
        assert [loss for _, loss in report.validation] == pytest.approx(
            [loss for _, loss in runs["gpipe"].validation], rel=1e-5), schedule
        assert report.replicas_in_sync
    assert runs["interleaved-1f1b"].config["virtual_stages"] == 2


@pytest.mark.slow
def test_bf16_autocast_with_bf16_activations_trains_close_to_fp32(text_file, user_model):
    fp32 = _run(user_model, text_file, steps=4, eval_every=0)
    bf16 = _run(user_model, text_file, steps=4, eval_every=0, precision="bf16", pp_codec="bf16")
    assert bf16.pp_bytes_per_cut == fp32.pp_bytes_per_cut // 2  # 2-byte activations on the wire
    assert bf16.losses == pytest.approx(fp32.losses, rel=0.02)
    assert bf16.losses != fp32.losses  # autocast really ran in bf16
    assert bf16.losses[-1] < bf16.losses[0] - 0.3 and bf16.replicas_in_sync
