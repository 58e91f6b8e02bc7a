"""Local SGD / DiLoCo outer steps (geotrain.optim.outer), in process against references, and in the
runtime (`RuntimeConfig.sync_every`, `geotrain train --sync-every`) over real gloo processes.

What "H = 1, outer lr 1, momentum 0" equals, precisely: every step each replica takes ONE inner step
from the common parameters on its own gradient (its inner optimizer state stays its own), and the
new common parameters are the mean of the replicas' parameters. With a plain SGD inner optimizer that
is synchronous data parallelism (theta - lr x mean gradient); with AdamW it is per-step parameter
averaging of the replicas' AdamW steps (not AdamW on the averaged gradient: AdamW is not linear).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adamw_drift import AdamWDrift, worst_excess
from geotrain.bench.wan_metrics import emulated_step_seconds, peak_inter_region_gbps
from geotrain.cluster import make_network
from geotrain.comm import ReducerContext, SimulatedCollective, get_reducer
from geotrain.data import world_tokens
from geotrain.models import even_boundaries, lm_loss, lr_at
from geotrain.optim.outer import OuterStep, OuterStepError
from geotrain.runtime import RuntimeConfig, RuntimeConfigError, launch
from geotrain.runtime import checkpoint as ckpt
from geotrain.models import MODEL_PRESETS
from geotrain.sync import BETAS, WEIGHT_DECAY
from geotrain.runtime.stages import build_layer_model, stage_modules
from geotrain.runtime.training_data import load_training_data

REPLICAS = 3


def _models(seed: int = 0) -> list[torch.nn.Module]:
    """REPLICAS identical small regression models (same initial weights)."""
    torch.manual_seed(seed)
    base = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    models = []
    for _ in range(REPLICAS):
        copy = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
        copy.load_state_dict(base.state_dict())
        models.append(copy)
    return models


def _batch(step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + replica)
    return torch.randn(8, 6, generator=generator), torch.randn(8, 2, generator=generator)


def _gradient(model: torch.nn.Module, step: int, replica: int) -> None:
    model.zero_grad(set_to_none=True)
    x, y = _batch(step, replica)
    torch.nn.functional.mse_loss(model(x), y).backward()


def _local_sgd(inner, steps: int, sync_every: int, lr: float, momentum: float, codec: str = "none"):
    """Replicas trained with OuterStep, their mean outer gradients averaged by the `codec` reducer
    over a simulated group. Returns the replicas' models."""
    models = _models()
    inners = [inner(m.parameters()) for m in models]
    outers = [OuterStep(m.parameters(), sync_every, lr, momentum) for m in models]
    shapes = [(name, p.shape) for name, p in models[0].named_parameters()]
    reducer = get_reducer(codec, ReducerContext.of(shapes, REPLICAS, local_workers=REPLICAS))
    collective = SimulatedCollective(REPLICAS)
    for step in range(steps):
        for r, (model, optimizer) in enumerate(zip(models, inners, strict=True)):
            _gradient(model, step, r)
            optimizer.step()
        if outers[0].due(step, steps):
            means = reducer.reduce([outer.outer_gradients() for outer in outers], collective, step)
            for outer in outers:
                outer.apply(means)
    return models


def _params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_h1_lr1_momentum0_with_inner_sgd_is_synchronous_data_parallel_sgd():
    steps, lr = 4, 0.1
    models = _local_sgd(lambda ps: torch.optim.SGD(ps, lr=lr), steps, 1, 1.0, 0.0)
    reference = _models()[0]
    for step in range(steps):  # theta <- theta - lr x mean_r g_r
        grads = []
        for r in range(REPLICAS):
            _gradient(reference, step, r)
            grads.append([p.grad.clone() for p in reference.parameters()])
        with torch.no_grad():
            for i, p in enumerate(reference.parameters()):
                p -= lr * torch.stack([g[i] for g in grads]).mean(0)
    for model in models:
        torch.testing.assert_close(_params(model), _params(reference), rtol=0, atol=1e-6)
    assert float((_params(models[0]) - _params(_models()[0])).abs().max()) > 1e-2  # it trained


def test_h1_lr1_momentum0_with_inner_adamw_averages_the_replicas_adamw_steps():
    steps = 4
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=BETAS, weight_decay=WEIGHT_DECAY)  # noqa: E731
    models = _local_sgd(adamw, steps, 1, 1.0, 0.0)
    replicas = _models()  # each replica: its own AdamW state, from the common weights every step
    optimizers = [adamw(m.parameters()) for m in replicas]
    for step in range(steps):
        for r, (model, optimizer) in enumerate(zip(replicas, optimizers, strict=True)):
            _gradient(model, step, r)
            optimizer.step()
        mean = torch.stack([_params(m) for m in replicas]).mean(0)
        for model in replicas:
            torch.nn.utils.vector_to_parameters(mean.clone(), model.parameters())
    for model in models:
        torch.testing.assert_close(_params(model), _params(replicas[0]), rtol=0, atol=1e-6)
    # not AdamW on the averaged gradient: that differs (AdamW normalises each replica's own moments)
    synchronous = _local_sgd(adamw, steps, 1, 1.0, 0.0)[0]
    single = _models()[0]
    optimizer = adamw(single.parameters())
    for step in range(steps):
        grads = []
        for r in range(REPLICAS):
            _gradient(single, step, r)
            grads.append([p.grad.clone() for p in single.parameters()])
        for i, p in enumerate(single.parameters()):
            p.grad = torch.stack([g[i] for g in grads]).mean(0)
        optimizer.step()
    assert float((_params(synchronous) - _params(single)).abs().max()) > 1e-4


def test_outer_nesterov_step_follows_torch_sgd_formula_and_h_steps_stay_local():
    model = _models()[0]
    outer = OuterStep(model.parameters(), 2, lr=0.7, momentum=0.9)
    start = _params(model).clone()
    deltas = [torch.full_like(start, 0.1), torch.full_like(start, -0.05)]
    buffer, expected = torch.zeros_like(start), start.clone()
    for delta in deltas:  # Nesterov: b = mu b + g; anchor -= lr (g + mu b)
        buffer = 0.9 * buffer + delta
        expected -= 0.7 * (delta + 0.9 * buffer)
        pieces = list(delta.split([p.numel() for p in model.parameters()]))
        outer.apply(pieces)
        torch.testing.assert_close(_params(model), expected, rtol=0, atol=1e-6)
    assert [outer.due(step, 7) for step in range(7)] == [False, True, False, True, False, True, True]
    state = outer.state_dict()
    other = OuterStep(_models()[1].parameters(), 2, lr=0.7, momentum=0.9)
    other.load_state_dict(state)
    assert other.anchor_sum() == pytest.approx(outer.anchor_sum(), abs=0)
    assert torch.equal(other.optimizer.state_dict()["state"][0]["momentum_buffer"],
                       outer.optimizer.state_dict()["state"][0]["momentum_buffer"])


def test_compressed_outer_exchange_with_error_feedback_still_trains_and_replicas_agree():
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=BETAS, weight_decay=WEIGHT_DECAY)  # noqa: E731
    models = _local_sgd(adamw, 8, 4, 0.7, 0.9, codec="int8-block")
    first = _params(models[0])
    assert all(torch.equal(first, _params(m)) for m in models)  # synchronised after the last step
    exact = _params(_local_sgd(adamw, 8, 4, 0.7, 0.9)[0])
    assert 0 < float((first - exact).abs().max()) < 1e-2  # int8 with error feedback: close, not equal


@pytest.mark.parametrize(("options", "message"), [
    ({"sync_every": 0}, "sync_every must be an integer >= 1, got 0"),
    ({"sync_every": 2, "outer_lr": 0.0}, "outer_lr must be a finite number > 0, got 0.0"),
    ({"sync_every": 2, "outer_momentum": 1.0}, "outer_momentum must be a finite number in \\[0, 1\\), got 1.0"),
    ({"sync_every": 2, "clip_grad_norm": 1.0}, "^--clip-grad-norm 1 with --sync-every 2: replicas do not exchange "
                                               "gradients, so the global gradient norm cannot be computed"),
    ({"sync_every": 2, "optimizer": "onebit-adam"}, "^--optimizer onebit-adam with --sync-every 2: local SGD runs AdamW "
                                                    "inside each replica; use --optimizer adamw$"),
])
def test_runtime_config_refuses_bad_outer_settings(options, message):
    with pytest.raises(RuntimeConfigError, match=message):
        _config(**options)
    with pytest.raises(OuterStepError, match="sync_every must be an integer >= 1, got 1.5"):
        OuterStep(_models()[0].parameters(), 1.5)  # type: ignore[arg-type]


def test_sync_every_is_part_of_the_checkpoint_identity():
    base = _config().identity()
    assert "sync_every" not in base
    diloco = _config(sync_every=4).identity()
    assert diloco["sync_every"] == 4 and diloco["outer_lr"] == 0.7 and diloco["outer_momentum"] == 0.9
    assert _config(sync_every=4, outer_lr=1.0).identity() != diloco


CLUSTER = make_network([1, 1], 10.0, (0.1, 0.1), (20.0, 20.0), seed=0, name="test-1x2")


def _config(**options) -> RuntimeConfig:
    return RuntimeConfig.of(cluster=CLUSTER, assignment=np.array([[0, 1]]),
                         **{"steps": 4, "time_scale": 0.0, "heartbeat_timeout_s": 20.0, "batch_size": 4,
                            "microbatches": 2, **options})


def _shards(directory, step: int, world_size: int) -> list[dict]:
    return [torch.load(ckpt.shard_path(directory, step, rank), map_location="cpu", weights_only=True)
            for rank in range(world_size)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_runtime_h1_parameter_averaging_equals_the_in_process_reference(tmp_path):
    """1 stage x 2 replicas over gloo, --sync-every 1 --outer-lr 1 --outer-momentum 0: the weights after
    2 steps are the reference's (each replica one AdamW step on its own batch from the common weights,
    then the mean)."""
    tokens = world_tokens(0)
    config = _config(sync_every=1, outer_lr=1.0, outer_momentum=0.0, stop_after=2, checkpoint_dir=str(tmp_path))
    launch(config, tokens=tokens)
    shards = _shards(tmp_path, 2, 2)
    data = load_training_data(None, config.data.data_seed, config.data.val_fraction, tokens)
    layers = [build_layer_model(config.model.model_name, MODEL_PRESETS, config.run.seed, data.vocab_size,
                                config.sequence_length) for _ in range(2)]
    replicas = [layer_model.as_module() for layer_model in layers]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=config.optim.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
                  for m in replicas]
    drifts = [AdamWDrift(optimizer) for optimizer in optimizers]
    for step in range(2):
        for r, (model, optimizer) in enumerate(zip(replicas, optimizers, strict=True)):
            x, y = data.batch(config.data.data_seed, step, r, 2, config.schedule.batch_size, config.sequence_length)
            optimizer.zero_grad()
            lm_loss(model(x), y).backward()
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, config.run.steps, config.optim.lr)
            optimizer.step()
            drifts[r].after_step()
        unaveraged = _params(replicas[0])  # what a run that skipped this step's average would hold
        mean = torch.stack([_params(m) for m in replicas]).mean(0)
        for model in replicas:
            torch.nn.utils.vector_to_parameters(mean.clone(), model.parameters())
    # the mean's rounding drift is at most the mean of the replicas' (tests/adamw_drift.py)
    per_replica = [list(m.parameters()) for m in replicas]
    bounds = [sum(drift.bound(params[i]) for drift, params in zip(drifts, per_replica, strict=True)) / 2
              for i in range(len(per_replica[0]))]
    position = {id(p): i for i, p in enumerate(replicas[0].parameters())}
    stage = stage_modules(layers[0], even_boundaries(layers[0].n_layers, 1), [0])[0]
    expected = {name: (p.detach(), bounds[position[id(p)]]) for name, p in stage.named_parameters()}
    assert all(set(shard["stage"]) == {f"0.{name}" for name in expected} for shard in shards)
    for shard in shards:
        assert max(worst_excess(value, *expected[name.removeprefix("0.")])
                   for name, value in shard["stage"].items()) <= 1.0
    # the bound is tight enough to see a real bug, and loose enough for a last-bit difference
    bound = torch.cat([b.reshape(-1) for b in bounds])
    assert worst_excess(unaveraged, mean, bound) > 10
    assert worst_excess(torch.nextafter(mean, mean + 1), mean, bound) < 1e-2
    assert float((mean - _params(build_layer_model(config.model.model_name, MODEL_PRESETS, config.run.seed, data.vocab_size,
                                                   config.sequence_length).as_module())).abs().max()) > 1e-3


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_runtime_diloco_exchanges_only_every_h_steps_and_resumes_exactly(tmp_path):
    """DiLoCo H=2 with an int8-block+EF outer exchange over emulated links: DP bytes only on steps
    2 and 4, replicas identical after each synchronisation, and a run interrupted after step 3
    (between synchronisations) resumes to the uninterrupted weights."""
    tokens = world_tokens(0)
    options = {"sync_every": 2, "dp_codec": "int8-block", "time_scale": 1e-3, "checkpoint_every": 2}
    whole = tmp_path / "whole"
    result = launch(_config(**options, checkpoint_dir=str(whole)), tokens=tokens)
    assert result.report.replicas_in_sync  # the anchors: identical on every step
    records = sorted(_shards(whole, 4, 2)[0]["records"], key=lambda r: r["step"])
    assert [r["dp_bytes"] > 0 for r in records] == [False, True, False, True]
    assert records[1]["emulated"]["inter_region_bytes"] > 0 and records[0]["emulated"]["inter_region_bytes"] == 0
    for record in records:  # each message between regions on its link inside its (blocking) step; bytes add up
        span = record["emulated"]
        assert sum(nbytes for _, _, nbytes in span["inter_region_wire"]) == pytest.approx(span["inter_region_bytes"])
        assert all(span["start_s"] <= a < b <= span["end_s"] for a, b, _ in span["inter_region_wire"])
        # one message to the one peer at a time, each on its 100 Mbit/s link for 8 x bytes / 1e8 s (by hand)
        assert all(b - a == pytest.approx(8 * nbytes / 0.1e9) for a, b, nbytes in span["inter_region_wire"])
    seconds = emulated_step_seconds(records, 4)
    assert peak_inter_region_gbps(records, seconds, window_s=1e-3) == pytest.approx(0.1)  # the link's own rate
    for step in (2, 4):
        first, second = (shard["stage"] for shard in _shards(whole, step, 2))
        assert all(torch.equal(first[name], second[name]) for name in first)
    parted = tmp_path / "parted"
    launch(_config(**options, checkpoint_dir=str(parted), stop_after=3), tokens=tokens)
    launch(_config(**options, checkpoint_dir=str(parted), resume=True), tokens=tokens)
    for uninterrupted, resumed in zip(_shards(whole, 4, 2), _shards(parted, 4, 2), strict=True):
        assert all(torch.equal(uninterrupted["stage"][name], value) for name, value in resumed["stage"].items())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_runtime_local_sgd_with_dp_hierarchical_makes_each_region_one_worker(tmp_path):
    """2 regions x 2 devices, 1 stage x 4 replicas, --sync-every 2 --dp-hierarchical: the members of a
    region average gradients every step (identical weights after step 1), the regions drift apart
    until the synchronisation at step 2, then all four agree."""
    cluster = make_network([2, 2], 10.0, (0.1, 0.1), (20.0, 20.0), seed=0, name="test-2x2")
    config = RuntimeConfig.of(cluster=cluster, assignment=np.array([[0, 1, 2, 3]]), steps=2, time_scale=1e-3,
                           heartbeat_timeout_s=20.0, batch_size=4, microbatches=2, sync_every=2,
                           dp_codec="int8-block", dp_hierarchical=True, checkpoint_dir=str(tmp_path),
                           checkpoint_every=1)
    launch(config, tokens=world_tokens(0))
    after_1 = [_shards_params(shard) for shard in _shards(tmp_path, 1, 4)]
    after_2 = [_shards_params(shard) for shard in _shards(tmp_path, 2, 4)]
    assert torch.equal(after_1[0], after_1[1]) and torch.equal(after_1[2], after_1[3])
    assert not torch.equal(after_1[0], after_1[2])
    assert all(torch.equal(after_2[0], params) for params in after_2[1:])
    records = sorted(_shards(tmp_path, 2, 4)[0]["records"], key=lambda r: r["step"])
    assert records[0]["dp_bytes"] > 0 and records[0]["emulated"]["inter_region_bytes"] == 0
    assert records[1]["emulated"]["inter_region_bytes"] > 0


def _shards_params(shard: dict) -> torch.Tensor:
    return torch.cat([value.reshape(-1) for value in shard["stage"].values()])
