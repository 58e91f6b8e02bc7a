"""geotrain.sync: make_gradient_sync picks the implementation from SyncOptions, refuses bad
combinations in one line, and every collective of a sync goes through the transport."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from geotrain.sync.base import ComputeTimer
from geotrain.codecs import CodecSpec
from geotrain.comm import CodecReducer, PowerSGDReducer
from geotrain.comm.hierarchical import HierarchicalGroups
from geotrain.comm.regions import Regions
from geotrain.comm import TorchCollective
from geotrain.optim import OneBitAdam
from geotrain.optim.region_collective import RegionCollective, RegionOneBitAdam
from geotrain.sync import (BETAS, WEIGHT_DECAY, DPGroup, HierarchicalGradientExchange, OneBitAdamSync, OuterSync,
                           PerStepSync, StageExchange, SyncError, SyncOptions, make_gradient_sync)


class RecordingTransport:
    """Runs every collective and records its bytes (the one timing path, without timing)."""

    def __init__(self) -> None:
        self.nbytes: list[int] = []

    def collective(self, group, devices, nbytes, run):
        result = run()
        self.nbytes.append(nbytes if isinstance(nbytes, int) else nbytes())
        return result


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _group(hierarchical: bool) -> DPGroup:
    hierarchy = HierarchicalGroups.create(Regions.of([[0]])) if hierarchical else None
    return DPGroup(dist.group.WORLD, (0,), (0,), hierarchy)


def _options(**kwargs) -> SyncOptions:
    return SyncOptions.of(**{"codec": "none", "optimizer": "adamw", "lr": 1e-2, "total_steps": 4, **kwargs})


def _backward(model: torch.nn.Module, seed: int) -> None:
    torch.manual_seed(100 + seed)
    model.zero_grad(set_to_none=True)
    model(torch.randn(5, 8)).square().mean().backward()


@pytest.mark.parametrize("options, sync_type, exchange_type, reducer_type", [
    ({}, PerStepSync, StageExchange, CodecReducer),
    ({"codec": "powersgd:rank=2"}, PerStepSync, StageExchange, PowerSGDReducer),
    ({"codec": "sign", "hierarchical": True}, PerStepSync, HierarchicalGradientExchange, None),
    ({"optimizer": "onebit-adam", "onebit_warmup_steps": 2}, OneBitAdamSync, None, None),
    ({"optimizer": "onebit-adam", "onebit_warmup_steps": 2, "hierarchical": True}, OneBitAdamSync, None,
     RegionCollective),
    ({"sync_every": 2, "codec": "int8-block"}, OuterSync, StageExchange, CodecReducer),
    ({"sync_every": 2, "codec": "int8-block", "hierarchical": True}, OuterSync, HierarchicalGradientExchange, None),
], ids=["flat", "powersgd", "hierarchical", "onebit-adam", "onebit-adam-hierarchical", "diloco",
        "diloco-hierarchical"])
def test_factory_picks_the_implementation_of_each_option_combination(world_of_one, options, sync_type, exchange_type,
                                                                     reducer_type):
    options = _options(**options)
    sync = make_gradient_sync(options, list(_model().named_parameters()), RecordingTransport(),
                              _group(options.exchange.hierarchical))
    assert type(sync) is sync_type
    if exchange_type is None:  # 1-bit Adam: its collective (the regions' with a hierarchy) and optimizer
        assert type(sync.optimizer) is (OneBitAdam if reducer_type is None else RegionOneBitAdam)
        assert type(sync.collective) is (reducer_type or TorchCollective)
        return
    assert type(sync.exchange) is exchange_type
    if reducer_type is not None:
        assert type(sync.exchange.reducer) is reducer_type
    assert isinstance(sync.optimizer, torch.optim.AdamW)


@pytest.mark.parametrize("options, message", [
    ({"optimizer": "sgd"}, "SyncOptions.optimizer must be one of adamw, onebit-adam, got 'sgd'"),
    ({"codec": "nope"}, "ExchangeOptions.codec 'nope': unknown codec 'nope'"),
    ({"codec": "topk:fraction=2"}, "fraction must be a number in (0, 1], got 2"),
    ({"lr": 0.0}, "SyncOptions.lr must be a finite number > 0, got 0.0"),
    ({"optimizer": "onebit-adam", "onebit_warmup_steps": 2, "codec": "int8"},
     "onebit-adam does its own data-parallel communication; codec must be none, got 'int8'"),
    ({"optimizer": "onebit-adam"}, "onebit-adam needs onebit_warmup_steps"),
    ({"codec": "powersgd", "hierarchical": True}, "hierarchical takes a codec of geotrain.codecs; powersgd is its own"),
    ({"sync_every": 0}, "sync_every must be an integer >= 1, got 0"),
    ({"sync_every": 2, "outer_momentum": 1.0}, "outer_momentum must be a finite number in [0, 1), got 1.0"),
    ({"sync_every": 2, "optimizer": "onebit-adam", "onebit_warmup_steps": 2}, "optimizer must be adamw"),
    ({"sync_every": 2, "clip_grad_norm": 1.0}, "clip_grad_norm 1.0 cannot be computed"),
])
def test_bad_options_are_refused_in_one_line_naming_the_value(options, message):
    with pytest.raises(SyncError) as info:
        _options(**options)
    text = str(info.value)
    assert message in text and "\n" not in text


def test_codec_is_parsed_once_into_a_spec():
    assert _options(codec="topk:fraction=0.1").exchange.codec == CodecSpec("topk", (("fraction", 0.1),))
    assert _options(codec=CodecSpec.parse("fp16")).exchange.codec == CodecSpec("fp16")


def test_a_hierarchy_the_options_do_not_ask_for_is_refused(world_of_one):
    with pytest.raises(SyncError, match="options.exchange.hierarchical is False but the DP group has region hierarchy"):
        make_gradient_sync(_options(), list(_model().named_parameters()), RecordingTransport(), _group(True))


def test_per_step_sync_of_one_replica_is_adamw_and_every_byte_goes_through_the_transport(world_of_one):
    model, reference = _model(), _model()
    transport = RecordingTransport()
    sync = make_gradient_sync(_options(codec="fp16", error_feedback=False), list(model.named_parameters()), transport,
                              _group(False))
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2, betas=BETAS, weight_decay=WEIGHT_DECAY)
    total = 0
    for step in range(3):
        _backward(model, step)
        _backward(reference, step)
        for p in reference.parameters():  # what the fp16 wire does to a gradient
            p.grad = p.grad.half().float()
        dp_bytes, norm = sync.step(step, ComputeTimer())
        optimizer.step()
        total += dp_bytes
        assert norm is None
    numel = sum(p.numel() for p in model.parameters())
    assert total == sum(transport.nbytes) == 3 * 2 * numel  # fp16: 2 bytes per value, every step
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)


def test_outer_sync_exchanges_only_when_a_period_ends_and_lr1_momentum0_moves_the_anchor_to_the_params(world_of_one):
    model = _model()
    transport = RecordingTransport()
    sync = make_gradient_sync(_options(sync_every=2, outer_lr=1.0, outer_momentum=0.0),
                              list(model.named_parameters()), transport, _group(False))
    start = sync.fingerprint()
    _backward(model, 0)
    assert sync.step(0, ComputeTimer()).dp_bytes == 0 and sync.fingerprint() == start and transport.nbytes == []
    _backward(model, 1)
    numel = sum(p.numel() for p in model.parameters())
    assert sync.step(1, ComputeTimer()).dp_bytes == 4 * numel == sum(transport.nbytes)
    assert sync.fingerprint() == pytest.approx(float(sum(p.detach().double().sum() for p in model.parameters())))
    assert sync.fingerprint() != start
    assert set(sync.state_dict()) == {"optimizer", "exchange", "outer"}


def test_a_per_step_checkpoint_is_refused_by_an_outer_sync_and_an_outer_one_resumes(world_of_one):
    per_step = make_gradient_sync(_options(), list(_model().named_parameters()), RecordingTransport(), _group(False))
    model = _model()
    outer = make_gradient_sync(_options(sync_every=2), list(model.named_parameters()), RecordingTransport(),
                               _group(False))
    with pytest.raises(ValueError, match="checkpoint was written without --sync-every"):
        outer.load_state_dict(per_step.state_dict())
    for step in range(2):
        _backward(model, step)
        outer.step(step, ComputeTimer())
    resumed = make_gradient_sync(_options(sync_every=2), list(_model().named_parameters()), RecordingTransport(),
                                 _group(False))
    resumed.load_state_dict(outer.state_dict())
    assert resumed.fingerprint() == outer.fingerprint() != make_gradient_sync(
        _options(sync_every=2), list(_model().named_parameters()), RecordingTransport(), _group(False)).fingerprint()


def test_onebit_adam_sync_reports_the_clipped_norm_only_in_its_warm_up(world_of_one):
    model = _model()
    transport = RecordingTransport()
    sync = make_gradient_sync(_options(optimizer="onebit-adam", onebit_warmup_steps=1, clip_grad_norm=1e-3),
                              list(model.named_parameters()), transport, _group(False))
    norms = []
    for step in range(3):
        _backward(model, step)
        result = sync.step(step, ComputeTimer())
        norms.append(result.grad_norm)
        assert result.dp_bytes > 0
    assert norms[0] is not None and norms[0] > 1e-3 and norms[1:] == [None, None]
    assert sum(transport.nbytes) > 0


def test_the_outer_state_in_host_memory_syncs_through_host_shadows_with_outer_syncs_numbers(world_of_one):
    """outer_state "host": the outer gradients travel in host shadows (StreamingOuterSync of one fragment, not the
    parameters' own gradients), the anchor and its momentum are host tensors, and after 3 outer syncs (int8-block
    with error feedback, DiLoCo's lr 0.7 and momentum 0.9) the parameters are OuterSync's bit for bit."""
    from geotrain.sync import StreamingOuterSync

    syncs, models = [], [_model(), _model()]
    for model, state in zip(models, ("device", "host"), strict=True):
        syncs.append(make_gradient_sync(_options(sync_every=2, codec="int8-block", total_steps=6, outer_state=state),
                                        list(model.named_parameters()), RecordingTransport(), _group(False)))
    device, host = syncs
    assert type(device) is OuterSync and type(host) is StreamingOuterSync
    for step in range(6):
        for model, sync in zip(models, syncs, strict=True):
            _backward(model, step)
            sync.step(step, ComputeTimer())
    assert all(torch.equal(p, q) for p, q in zip(*(m.parameters() for m in models), strict=True))
    outer = host.fragments[0].outer
    momentum = [outer.optimizer.state[a]["momentum_buffer"] for a in outer.anchor]
    assert {t.device.type for t in [*outer.anchor, *momentum, *host.fragments[0].shadows]} == {"cpu"}
