"""The runtime's pieces of the CUDA path that run without a GPU (benchmarks/cuda/check.sh runs the rest on
one): the last stage's fp32 logits under autocast and the refusals (more ranks than GPUs, 1-bit Adam on
CUDA). The host-staged exchanges: tests/unit/sync/test_sync_host_staging.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geotrain.cluster import make_network
from geotrain.cluster.io import parse_cluster_text
from geotrain.models import GPTConfig
from geotrain.runtime.config import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.stages import StageModule, stage_shapes, tiny_layer_model
from geotrain.runtime.worker import check_gpus_per_rank
from paths import ROOT


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
    non-elastic replicate dimension does; emulated links are refused in one line."""
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
    with pytest.raises(RuntimeConfigError, match="^--device cuda with --time-scale 0.5: link emulation"):
        RuntimeConfig.of(**{**base, "time_scale": 0.5}, assignment=np.array([[0, 1, 2]]))
    with pytest.raises(RuntimeConfigError, match="^--elastic: run.device cuda with --outer-sync async: elastic "
                                                 "asynchronous groups compute on the CPU"):
        RuntimeConfig.of(**{**base, "outer_sync": "async"}, assignment=np.array([[0, 1, 2]]))


LAB = parse_cluster_text((ROOT / "examples" / "clusters" / "lab-2x4.yaml").read_text())  # 0-3 east, 4-7 west
SHARDED_PIPELINE = {"assignment": np.array([[0, 4], [2, 6]]),
                    "shards": np.array([[[0, 1], [4, 5]], [[2, 3], [6, 7]]])}
"""S = 2, K = 2, R = 2 (tests/integration/runtime/test_runtime_elastic_sharded.py's plan): each group in one site."""
ELASTIC_CUDA = {"device": "cuda", "time_scale": 0.0, "elastic": True, "sync_every": 4, "model_name": "tiny-2layer"}


def elastic_group_groups(monkeypatch, config, group, rank, device):
    """The process groups (ranks, backend), FSDP2's (group, device) and the pipeline's (group, device) that group
    rank `rank` of replica group `group` creates building its stage (runtime/elastic/stage.GroupStageModel),
    new_group recorded and the GPU's pieces stood in for (the construction, not a GPU, is tested)."""
    from geotrain.runtime.elastic import stage as stage_module
    from geotrain.sync.base import ComputeTimer

    made, placed = [], {}
    monkeypatch.setattr(stage_module, "new_group", lambda ranks, timeout_s, backend: made.append(
        (tuple(ranks), backend)) or len(made) - 1)
    # each with whether the stage was on its device by then
    monkeypatch.setattr(stage_module, "fully_shard_stage", lambda modules, group, device: placed.update(
        fsdp=(made[group], device, "module" in placed)))
    monkeypatch.setattr(stage_module, "Pipeline", lambda *args: placed.update(
        pipeline=(args[5], args[6], "module" in placed)))
    monkeypatch.setattr(torch.nn.Module, "to", lambda module, *args, **kwargs: placed.update(module=args) or module)
    stage_module.GroupStageModel(config, stage_module.group_position(config, rank), 64, 16, ComputeTimer(), group,
                                 device)
    return made, placed


def test_an_elastic_group_of_2_stages_x_2_shards_on_cuda_takes_nccl_inside_its_site_and_a_gpu_per_process(monkeypatch):
    """--elastic --device cuda with S x K = 4 processes per group (issue #46), checked without a GPU: every group of a
    group's own follows comm/groups.group_backend (FSDP2 shards and the pipeline inside one site: NCCL; the group's
    default group: the per-device string, gloo for its host scalars; on CPU: gloo as before); each process on GPU
    (group x 4 + rank) mod the GPU count, so a group's 4 are on 4 GPUs; torchft's group stays gloo (host copies)."""
    from geotrain.comm.groups import PER_DEVICE_BACKEND, torchft_backend
    from geotrain.runtime.elastic.group import group_torch_device
    from geotrain.runtime.elastic.stage import own_group_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    config = RuntimeConfig.of(LAB, **SHARDED_PIPELINE, **ELASTIC_CUDA)
    assert [[group_torch_device(config, g, r) for r in range(4)] for g in range(2)] == [
        [torch.device("cuda", i) for i in range(4)], [torch.device("cuda", i) for i in range(4, 8)]]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # the groups share the 4 GPUs, one each inside
    assert [group_torch_device(config, 1, r) for r in range(4)] == [torch.device("cuda", i) for i in range(4)]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(RuntimeConfigError, match="^device cuda: 4 ranks on this host but 2 GPU"):
        group_torch_device(config, 0, 0)
    assert own_group_backend(config, 1, range(4), "world", "cuda") == PER_DEVICE_BACKEND
    assert own_group_backend(config, 1, range(4), "world", "cpu") == "gloo"  # pipeline_group's, as before
    assert torchft_backend("cuda", 2) == "gloo"
    made, placed = elastic_group_groups(monkeypatch, config, 1, 3, torch.device("cuda", 3))
    # shard groups per stage, then pipeline groups per shard (tiny-2layer ties no weight across stages)
    assert made == [((0, 1), "nccl"), ((2, 3), "nccl"), ((0, 2), "nccl"), ((1, 3), "nccl")]
    assert placed == {"fsdp": (((2, 3), "nccl"), torch.device("cuda", 3), True),
                      "pipeline": (3, torch.device("cuda", 3), True), "module": (torch.device("cuda", 3),)}
    cpu = RuntimeConfig.of(LAB, **SHARDED_PIPELINE, **{**ELASTIC_CUDA, "device": "cpu"})
    made, placed = elastic_group_groups(monkeypatch, cpu, 1, 3, torch.device("cpu"))
    assert [backend for _, backend in made] == [None] * 4 and placed["fsdp"][1] == torch.device("cpu")


def test_an_elastic_group_across_sites_on_cuda_keeps_its_pipeline_on_the_per_device_backend(monkeypatch):
    """A group whose stage 1 sits in the other site: its shard groups stay NCCL (inside a site), its pipeline
    groups cross the sites and take the per-device string, as a non-elastic run's would."""
    from geotrain.comm.groups import PER_DEVICE_BACKEND

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = RuntimeConfig.of(LAB, assignment=np.array([[0, 6], [4, 2]]),
                              shards=np.array([[[0, 1], [6, 7]], [[4, 5], [2, 3]]]), **ELASTIC_CUDA)
    made, _ = elastic_group_groups(monkeypatch, config, 0, 0, torch.device("cuda", 0))
    assert made == [((0, 1), "nccl"), ((2, 3), "nccl"), ((0, 2), PER_DEVICE_BACKEND), ((1, 3), PER_DEVICE_BACKEND)]


@pytest.mark.parametrize("setting, named", [
    ({"chaos": "partition:site=1,at=1s,for=1s"}, "a partition in --chaos"),
    ({"netlab": True}, "--netlab")])
def test_elastic_groups_of_s_x_k_processes_on_cuda_refuse_what_is_not_wired_in_one_line(monkeypatch, setting, named):
    """What stays refused for S x K > 1 on CUDA (runtime/elastic/rules.cuda_group_blocker); the same S x K plan on
    CPU, and one process per group on CUDA, are accepted."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeConfigError, match=f"^--elastic: run.device cuda with a plan of 2 stages x 2 devices "
                                                 f"per slot: not built yet with {named}"):
        RuntimeConfig.of(LAB, **SHARDED_PIPELINE, **ELASTIC_CUDA, **setting)
    if "netlab" not in setting:  # the lab needs root: its own refusals speak first here
        RuntimeConfig.of(LAB, **SHARDED_PIPELINE, **{**ELASTIC_CUDA, "device": "cpu"}, **setting)
    RuntimeConfig.of(LAB, assignment=np.array([[0, 4]]), **ELASTIC_CUDA, **setting)
