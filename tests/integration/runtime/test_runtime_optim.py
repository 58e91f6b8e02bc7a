"""The runtime's optimizer and clipping (geotrain.runtime.dp_step), in real 2 stages x 2 replicas runs:
OneBitAdam over each stage's DP group, and global gradient clipping across stages checked against a
single-process reference on the unsplit model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adamw_drift import GRAD_RELATIVE_ERROR, AdamWDrift, worst_excess
from geotrain.cluster import make_network
from geotrain.comm import OneBitLayout
from geotrain.data import world_tokens
from geotrain.models import even_boundaries, lm_loss, lr_at
from geotrain.runtime import RuntimeConfig, RuntimeConfigError, launch
from geotrain.runtime import checkpoint as ckpt
from geotrain.models import MODEL_PRESETS
from geotrain.runtime.stages import build_layer_model, stage_modules
from geotrain.runtime.training_data import load_training_data

pytestmark = pytest.mark.timeout(300)

CLUSTER = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0, name="test-2x2")
ASSIGNMENT = np.array([[0, 2], [1, 3]])


@pytest.fixture(scope="module")
def tokens():
    return world_tokens(0)


def _config(**options) -> RuntimeConfig:
    return RuntimeConfig.of(cluster=CLUSTER, assignment=ASSIGNMENT,
                         **{"steps": 4, "time_scale": 0.0, "heartbeat_timeout_s": 20.0, **options})


def _model_and_data(config: RuntimeConfig, world):
    """The run's whole model (same seed, so the same initial weights) and its training data."""
    data = load_training_data(None, config.data.data_seed, config.data.val_fraction, world)
    return build_layer_model(config.model.model_name, MODEL_PRESETS, config.run.seed, data.vocab_size,
                             config.sequence_length), data


def _stage(model, config: RuntimeConfig, stage: int) -> torch.nn.Module:
    return stage_modules(model, even_boundaries(model.n_layers, config.stages), [stage])[stage]


def _shards(directory, step: int, world_size: int) -> list[dict]:
    return [torch.load(ckpt.shard_path(directory, step, rank), map_location="cpu", weights_only=True)
            for rank in range(world_size)]


def test_onebit_adam_and_clipping_are_validated_and_part_of_the_checkpoint_identity():
    with pytest.raises(RuntimeConfigError, match="optimizer must be one of adamw, onebit-adam, got 'lamb'"):
        _config(optimizer="lamb")
    with pytest.raises(RuntimeConfigError, match="^--optimizer onebit-adam with --dp-codec fp16: 1-bit Adam does its "
                                                 "own data-parallel communication; use --dp-codec none$"):
        _config(optimizer="onebit-adam", dp_codec="fp16")
    with pytest.raises(RuntimeConfigError, match="clip_grad_norm must be a finite number > 0, got -1.0"):
        _config(clip_grad_norm=-1.0)
    with pytest.raises(RuntimeConfigError, match="onebit_warmup_steps must be an integer >= 1, got 0"):
        _config(optimizer="onebit-adam", onebit_warmup_steps=0)
    base = _config().identity()
    assert _config(optimizer="onebit-adam").identity() != base
    assert _config(clip_grad_norm=1.0).identity() != base


@pytest.mark.slow
def test_onebit_adam_2x2_loss_falls_replicas_stay_identical_and_resume_is_exact(tokens, tmp_path):
    options = {"steps": 8, "optimizer": "onebit-adam", "onebit_warmup_steps": 3, "pp_codec": "fp16"}
    uninterrupted = launch(_config(**options), tokens=tokens).report
    launch(_config(**options, stop_after=5, checkpoint_dir=str(tmp_path)), tokens=tokens)
    resumed = launch(_config(**options, resume=True, checkpoint_dir=str(tmp_path)), tokens=tokens).report
    assert uninterrupted.replicas_in_sync and resumed.replicas_in_sync  # bit-identical stage weights, every step
    assert uninterrupted.losses[-1] < uninterrupted.losses[0] - 0.3
    assert resumed.losses == uninterrupted.losses  # moments, frozen variance, 1-bit residuals restored
    # warm-up: one fp32 all-reduce of the stage; after the freeze one all-to-all + one all-gather of
    # 1-bit messages: (R + 1) x message_bytes, ~ 4 n / (n/8 x 1.5) = 21x less with R = 2
    config = _config(**options)
    stage0 = _stage(_model_and_data(config, tokens)[0], config, 0)
    layout = OneBitLayout([p.numel() for p in stage0.parameters()], config.replicas)
    records = _shards(tmp_path, 8, 4)[0]["records"]  # rank 0: stage 0, replica 0
    warm, frozen = records[0]["dp_bytes"], records[-1]["dp_bytes"]
    assert warm == 4 * sum(p.numel() for p in stage0.parameters())
    assert frozen == (config.replicas + 1) * layout.message_bytes
    assert warm / frozen > 20


def _reference(config: RuntimeConfig, world, steps: int, clip: float | None):
    """The unsplit model trained in this process on the same global batches (every replica's windows):
    the gradient norm per step before clipping, the layer model after `steps` clipped AdamW steps, and
    its parameters' rounding drift bounds (tests/adamw_drift.py)."""
    from geotrain.comm import clip_grad_norm_

    layers, data = _model_and_data(config, world)
    model = layers.as_module()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.optim.lr, betas=(0.9, 0.95), weight_decay=0.1)
    drift = AdamWDrift(optimizer)
    norms = []
    for step in range(steps):
        batches = [data.batch(config.data.data_seed, step, r, config.replicas, config.schedule.batch_size, config.sequence_length)
                   for r in range(config.replicas)]
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        optimizer.zero_grad()
        lm_loss(model(x), y).backward()
        norms.append(clip_grad_norm_([p.grad for p in model.parameters()], clip))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config.run.steps, config.optim.lr)
        optimizer.step()
        drift.after_step()
    return norms, layers, drift


@pytest.mark.slow
def test_clipped_global_norm_across_stages_equals_the_unsplit_model(tokens, tmp_path):
    config = _config(steps=4, clip_grad_norm=0.5, stop_after=2, checkpoint_dir=str(tmp_path))
    launch(config, tokens=tokens)
    shards = _shards(tmp_path, 2, config.world_size)
    norms, model, drift = _reference(config, tokens, 2, clip=0.5)
    unclipped_norms, unclipped, _ = _reference(config, tokens, 2, clip=None)
    assert min(norms) > 0.5  # the clip is active on both steps
    for shard in shards:  # every rank saw the same global norm, the unsplit model's (|norm(g + e) - norm(g)|
        # <= norm(e), and each gradient's rounding error is GRAD_RELATIVE_ERROR of its scale at most)
        assert [r["grad_norm"] for r in shard["records"]] == pytest.approx(norms, rel=GRAD_RELATIVE_ERROR)
    worst_clipped = worst_unclipped = 0.0
    for rank, shard in enumerate(shards):
        slot = config.layout.slot(rank)
        expected = dict(_stage(model, config, slot.stage).named_parameters())
        plain = _stage(unclipped, config, slot.stage).state_dict()
        assert set(shard["stage"]) == {f"0.{name}" for name in expected}
        for name, value in shard["stage"].items():
            name = name.removeprefix("0.")  # the rank's ModuleList of (virtual) stages
            bound = drift.bound(expected[name])
            worst_clipped = max(worst_clipped, worst_excess(value, expected[name].detach(), bound))
            worst_unclipped = max(worst_unclipped, worst_excess(value, plain[name], bound))
    assert worst_clipped <= 1.0
    assert worst_unclipped > 10  # without the clip the weights are measurably elsewhere
