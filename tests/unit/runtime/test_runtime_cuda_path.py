"""The runtime's pieces of the CUDA path that run without a GPU (benchmarks/cuda/check.sh runs the rest on
one): the last stage's fp32 logits under autocast and the refusals (more ranks than GPUs, 1-bit Adam on
CUDA). The host-staged exchanges: tests/unit/sync/test_sync_host_staging.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geotrain.cluster import make_network
from geotrain.models import GPTConfig
from geotrain.runtime.config import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.stages import StageModule, stage_shapes, tiny_layer_model
from geotrain.runtime.worker import check_gpus_per_rank


def test_last_stage_gives_fp32_logits_under_bf16_autocast_as_its_declared_shape_says():
    model = tiny_layer_model(GPTConfig(n_layer=2), seed=0)
    shapes = stage_shapes(model, (0, 2, 4), microbatch=2, seq_len=8)
    assert shapes[-1].output_dtype == torch.float32
    last = StageModule(model.layers[2:], is_last=True)
    first = StageModule(model.layers[:2], is_last=False, wire_dtype=torch.bfloat16)
    tokens = torch.randint(44, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = first(tokens)
        logits = last(hidden)
    assert hidden.dtype == torch.bfloat16  # the wire dtype between stages is kept
    assert logits.dtype == torch.float32 and logits.shape == shapes[-1].output_shape


@pytest.mark.parametrize("ranks, gpus, refused", [(1, 1, False), (2, 2, False), (2, 1, True), (8, 4, True)])
def test_more_ranks_than_gpus_on_a_host_is_refused_in_one_line(ranks, gpus, refused):
    if not refused:
        check_gpus_per_rank(ranks, gpus)
        return
    with pytest.raises(RuntimeConfigError, match=f"{ranks} ranks on this host but {gpus} GPU"):
        check_gpus_per_rank(ranks, gpus)


def test_onebit_adam_on_cuda_is_accepted_flat_and_hierarchical(monkeypatch):
    """1-bit Adam keeps its state on the parameters' device and hands host copies of its messages to gloo
    (geotrain.sync.onebit); here the config, not a GPU, is tested."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    geo = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0)
    base = {"cluster": geo, "assignment": np.array([[0, 2], [1, 3]]), "device": "cuda", "time_scale": 0.0}
    for hierarchical in (False, True):
        config = RuntimeConfig.of(**base, optimizer="onebit-adam", dp_hierarchical=hierarchical)
        assert config.run.device == "cuda" and config.optim.optimizer == "onebit-adam"


def test_the_outer_state_in_host_memory_is_accepted_on_cuda_and_refused_with_asynchronous_updates(monkeypatch):
    """--outer-state host on a GPU (geotrain.optim.outer_state): every synchronous outer sync takes it; the
    asynchronous one keeps its flat anchor beside the parameters, so the pair is refused in one line naming both
    flags (on the CPU its anchor is host memory already: accepted)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the refusal, not a GPU, is tested
    geo = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0)
    base = {"cluster": geo, "assignment": np.array([[0, 2]]), "time_scale": 0.0, "sync_every": 2,
            "outer_state": "host", "dp_codec": "none"}
    for device in ("cuda", "auto"):
        config = RuntimeConfig.of(**base, device=device)
        assert config.sync_options(0).outer.outer_state == "host"
        with pytest.raises(RuntimeConfigError, match=f"^--outer-state host with --outer-sync async on --device "
                                                     f"{device}: not built"):
            RuntimeConfig.of(**base, device=device, outer_sync="async")
    RuntimeConfig.of(**base, device="cpu", outer_sync="async")
    with pytest.raises(RuntimeConfigError, match="outer_state.*needs optim.sync_every"):
        RuntimeConfig.of(**{k: v for k, v in base.items() if k != "sync_every"}, device="cpu")


def test_elastic_groups_on_cuda_take_a_gpu_each_and_exchange_host_copies_on_gloo(monkeypatch):
    """--elastic --device cuda, checked without a GPU (benchmarks/cuda/check.sh runs it on one): one process per
    group on GPU group mod the GPU count; torchft's group is gloo, carrying the exchange's host copies as the
    non-elastic replicate dimension does; a plan of 2 stages and emulated links are refused in one line."""
    from geotrain.comm.groups import PER_DEVICE_BACKEND, group_backend, torchft_backend
    from geotrain.runtime.elastic.group import group_torch_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    geo = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0)
    base = {"cluster": geo, "device": "cuda", "time_scale": 0.0, "elastic": True, "sync_every": 4}
    config = RuntimeConfig.of(**base, assignment=np.array([[0, 1, 2]]))
    assert [group_torch_device(config, g) for g in range(3)] == [torch.device("cuda", g % 2) for g in range(3)]
    assert group_backend("cuda", "replicate", 2) == PER_DEVICE_BACKEND and torchft_backend("cuda", 2) == "gloo"
    assert torchft_backend("cpu", 1) == "gloo"
    auto = RuntimeConfig.of(**{**base, "device": "auto"}, assignment=np.array([[0, 1, 2]]))
    assert group_torch_device(auto, 0) == torch.device("cpu")  # an elastic run takes a GPU only when told
    with pytest.raises(RuntimeConfigError, match="^--elastic: run.device cuda with a plan of 2 stages x 1 devices"):
        RuntimeConfig.of(**base, assignment=np.array([[0, 2], [1, 3]]))
    with pytest.raises(RuntimeConfigError, match="^--device cuda with --time-scale 0.5: link emulation"):
        RuntimeConfig.of(**{**base, "time_scale": 0.5}, assignment=np.array([[0, 1, 2]]))
