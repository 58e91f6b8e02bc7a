"""Runtime pieces that need no worker processes: link busy time, prediction,
layout, schedules, stage split, checkpoints, watchdog, config validation."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.codecs import CodecError
from geotrain.cluster import make_network
from geotrain.cost import YuanCostModel
from geotrain.models import GPTConfig, even_boundaries, make_model
from geotrain.runtime import (
    CheckpointError,
    Layout,
    RuntimeConfig,
    RuntimeConfigError,
    busy_seconds,
    parse_codec_spec,
    predict_comm,
    measured_traffic,
)
from geotrain.runtime.stages import stage_modules, tiny_layer_model
from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime.watchdog import EXIT_PEER_LOST, Watchdog

GEO = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0)  # 10 Mbit/s, 20 ms between regions


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors: one thread is fastest


# -- link busy time ----------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 10)), max_size=12))
def test_busy_seconds_is_the_length_of_the_union(raw):
    intervals = [(float(start), float(start + length)) for start, length in raw]
    covered = np.zeros(60, dtype=bool)
    for start, end in intervals:
        covered[int(start):int(end)] = True
    assert busy_seconds(intervals) == pytest.approx(float(covered.sum()))


# -- prediction ----------------------------------------------------------------------------------

def test_measured_traffic_holds_the_bytes_exactly():
    traffic = measured_traffic([1_657_856, 1_609_728], 393_216, replicas=4)
    assert traffic.dp_bytes == (1_657_856, 1_609_728) and traffic.pp_bytes == (393_216,) and traffic.replicas == 4
    looped = measured_traffic([1, 1], 393_216, replicas=4, virtual_stages=2)  # rank 0 sends over 2 of the 3 cuts
    assert looped.pp_bytes == (196_608,) * 3 and looped.virtual_stages == 2


def test_prediction_equals_the_yuan_model_for_uniform_bytes():
    assignment = np.array([[0, 2], [1, 3]])
    prediction = predict_comm(GEO, assignment, [500_000, 500_000], 200_000, time_scale=0.1)
    cost = YuanCostModel(GEO, measured_traffic([500_000, 500_000], 200_000, 2)).evaluate(assignment)
    assert prediction.dp_s == pytest.approx(0.1 * cost.dp) and prediction.pp_s == pytest.approx(0.1 * cost.pp)
    uneven = predict_comm(GEO, assignment, [500_000, 2_000_000], 200_000, time_scale=0.1)
    assert uneven.dp_per_stage_s[1] > uneven.dp_per_stage_s[0] and uneven.dp_s == uneven.dp_per_stage_s[1]


# -- layout, schedules, stage split ------------------------------------------------------------------

@given(st.integers(1, 12), st.integers(1, 12))
def test_equal_layer_split_is_contiguous_balanced_and_covers_all_layers(n_layers, stages):
    if stages > n_layers:
        with pytest.raises(ValueError):
            even_boundaries(n_layers, stages)
        return
    cuts = even_boundaries(n_layers, stages)
    assert cuts[0] == 0 and cuts[-1] == n_layers and len(cuts) == stages + 1
    sizes = np.diff(cuts)
    assert sizes.min() >= 1 and sizes.max() - sizes.min() <= 1


def test_layout_ranks_groups_and_neighbours():
    layout = Layout(np.array([[4, 5, 6], [0, 1, 2]]))
    assert [layout.slot(r).device for r in range(6)] == [4, 5, 6, 0, 1, 2]
    assert layout.dp_group_ranks(1) == [3, 4, 5] and layout.dp_group_devices(0) == [4, 5, 6]
    assert layout.next_rank(1) == 4 and layout.prev_rank(4) == 1 and layout.prev_rank(1) is None


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_stage_split_gives_the_unsplit_models_logits_and_gradients(stages):
    config = GPTConfig(n_layer=4)
    full, split_source = make_model(config, seed=3), tiny_layer_model(config, seed=3)
    idx = torch.randint(0, config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    hidden = idx
    cuts = even_boundaries(split_source.n_layers, stages)
    parts = stage_modules(split_source, cuts, range(stages))
    for part in parts.values():
        hidden = part(hidden)
    expected = full(idx)
    assert torch.equal(hidden, expected)
    hidden.square().mean().backward()
    expected.square().mean().backward()
    split_params = dict(split_source.as_module().named_parameters())
    assert len(split_params) == len(list(full.parameters()))
    for (name, a), b in zip(full.named_parameters(), split_params.values()):
        assert torch.equal(a.grad, b.grad), name
    owned = [id(p) for part in parts.values() for p in part.parameters()]
    assert sorted(owned) == sorted(id(p) for p in split_params.values())  # every weight in exactly one stage


# -- checkpoints ---------------------------------------------------------------------------------

def test_checkpoint_manifest_latest_pointer_and_identity(tmp_path):
    identity = {"seed": 1, "stages": 2}
    for rank in range(2):
        ckpt.save_shard(tmp_path, 3, rank, {"slot": {"rank": rank}, "completed": 3, "x": torch.full((2,), float(rank))},
                       identity)
    assert ckpt.latest_step(tmp_path) is None  # shards without a manifest are not a checkpoint
    ckpt.write_manifest(tmp_path, 3, identity, world_size=2)
    assert ckpt.latest_step(tmp_path) == 3
    manifest = ckpt.read_manifest(tmp_path, 3)
    assert torch.equal(ckpt.load_shard(tmp_path, 3, 1, manifest, {"rank": 1})["x"], torch.ones(2))
    ckpt.save_shard(tmp_path, 6, 0, {"completed": 6}, identity)
    with pytest.raises(CheckpointError, match="shard missing"):
        ckpt.write_manifest(tmp_path, 6, identity, world_size=2)
    assert ckpt.latest_step(tmp_path) == 3
    assert not list(tmp_path.rglob("*.tmp-*"))
    manifest = ckpt.read_manifest(tmp_path, 3)
    ckpt.check_identity(manifest, identity, "here")
    with pytest.raises(CheckpointError, match="seed is 1 there, 2 now"):
        ckpt.check_identity(manifest, {"seed": 2, "stages": 2}, "here")


# -- watchdog ------------------------------------------------------------------------------------

def test_watchdog_names_the_silent_rank_and_its_last_completed_step():
    master = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)

    def client() -> Any:
        return dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=10))

    exits: list[int] = []
    names = lambda r: f"rank {r}"  # noqa: E731
    alive = Watchdog(client(), client(), 0, 2, names, interval_s=0.05, timeout_s=0.3, exit_fn=exits.append)
    silent = Watchdog(client(), client(), 1, 2, names, interval_s=0.05, timeout_s=0.3, exit_fn=exits.append)
    silent.publish_step(4)
    silent.check_once()  # one heartbeat, then silence
    alive.start()
    deadline = threading.Event()
    deadline.wait(1.5)
    assert exits == [EXIT_PEER_LOST]
    assert alive.failure is not None and "lost rank 1" in alive.failure and "last completed step: 4" in alive.failure
    assert master.get("abort").decode() == alive.failure
    assert silent.check_once().startswith("abort: lost rank 1")


def test_watchdog_says_its_last_words_before_it_exits_and_names_who_holds_a_collective_up():
    master = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)

    def client() -> Any:
        return dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=10))

    happened: list[Any] = []
    names = lambda r: f"rank {r}"  # noqa: E731
    in_collective = [True, False, True]
    dogs = [Watchdog(client(), client(), r, 3, names, interval_s=0.05, timeout_s=5.0, exit_fn=happened.append,
                     last_words=lambda why, step: happened.append((why, step)), waiting=lambda r=r: in_collective[r])
            for r in range(3)]
    for dog, steps in zip(dogs, (3, 3, 2), strict=True):
        dog.publish_step(steps)
        dog.check_once()  # a heartbeat with its phase
    # rank 0 waits in a collective: rank 2 is a step behind, rank 1 as far but not waiting; rank 0 is not behind
    assert dogs[0].suspects(range(3)) == [(2, 2), (1, 3)]
    assert dogs[2].suspects(range(3)) == []
    in_collective[1] = True
    dogs[1].check_once()
    assert dogs[0].suspects([0, 1]) == []
    # a rank's own abort notice is its main thread's to act on; a peer's ends it, last words first
    dogs[1].post_abort("rank 1 failed at step 4")
    assert dogs[1].check_once() is None
    dogs[0].start()
    threading.Event().wait(1.0)
    assert happened == [("ended by the watchdog: abort: rank 1 failed at step 4", 3), EXIT_PEER_LOST]


# -- configuration -------------------------------------------------------------------------------

def test_codec_specs_parse_names_and_typed_parameters():
    assert parse_codec_spec("fp16") == ("fp16", {})
    assert parse_codec_spec("topk:fraction=0.01,value_dtype=fp16") == ("topk", {"fraction": 0.01, "value_dtype": "fp16"})
    with pytest.raises(CodecError, match="key=value"):
        parse_codec_spec("topk:0.01")
    with pytest.raises(CodecError, match="given twice"):  # one spec parser for codecs and the runtime
        parse_codec_spec("topk:fraction=0.5,fraction=0.1")


@pytest.mark.parametrize("change, message", [
    ({"microbatches": 3}, "batch_size must be a positive multiple of microbatches"),
    ({"pp_codec": "topk"}, "pipeline codec must be one of"),
    ({"assignment": np.array([[0, 0], [1, 3]])}, "device 0 is used more than once"),
    ({"assignment": np.array([[0, 2], [1, 4]])}, "device index must be in 0..3"),
    ({"assignment": np.array([[0], [1], [2], [3]]), "gpt": GPTConfig(n_layer=1)}, "cannot cut 3 layers into 4"),
    ({"pp_codec": "randk"}, "payload layout depends on the data"),
    ({"schedule": "interleaved-1f1b", "microbatches": 3, "batch_size": 6}, "multiple of the 2 stages"),
    ({"schedule": "gpipe", "virtual_stages": 2}, "virtual_stages must be 1"),
    ({"device": "cuda"}, "device cuda: "),  # no CUDA here, or CUDA with emulation on: refused either way
    ({"split": "flops"}, "split must be one of"),
    ({"eval_every": 2, "val_fraction": 0.0}, "needs a held-out split"),
    ({"resume": True}, "resume needs a checkpoint directory"),
    ({"time_scale": -1.0}, "time_scale must be a finite number >= 0"),
    ({"dp_codec": "topk:k=3"}, "codec 'topk' has no parameter"),
])
def test_config_rejects_bad_options_with_the_value(change, message):
    base = {"cluster": GEO, "assignment": np.array([[0, 2], [1, 3]])}
    with pytest.raises(ValueError, match=message):
        RuntimeConfig.of(**{**base, **change})


# -- bench plans ---------------------------------------------------------------------------------

def test_bench_crossing_plan_crosses_every_cut_and_group_and_random_is_the_median():
    from geotrain.runtime.bench import (
        RuntimeBenchConfig,
        _problem,
        bench_cluster,
        median_random_assignment,
        region_crossing_assignment,
    )

    config = RuntimeBenchConfig()
    cluster = bench_cluster(config)
    crossing = region_crossing_assignment(cluster, config.stages, config.replicas)
    regions = cluster.region_of[crossing]
    assert np.all(regions[0] != regions[1])  # every pipeline cut crosses
    assert all(len(set(row)) == 2 for row in regions)  # every DP group spans both regions
    problem = _problem(cluster, config, (1_657_856, 1_609_728), 393_216)
    median = median_random_assignment(problem, seed=0)
    rng = np.random.default_rng(0)
    orders = np.argsort(rng.random((201, 8)), axis=1).reshape(201, 2, 4)
    totals = problem.cost_model.evaluate_many(orders)
    assert problem.cost_model.evaluate(median).total == pytest.approx(float(np.median(totals)))


def test_resume_is_refused_before_launch_without_a_matching_checkpoint(tmp_path):
    from geotrain.runtime.launcher import check_resumable

    config = RuntimeConfig.of(cluster=GEO, assignment=np.array([[0, 2], [1, 3]]), checkpoint_dir=str(tmp_path), resume=True)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        check_resumable(config)
    for rank in range(4):
        ckpt.save_shard(tmp_path, 2, rank, {}, config.identity())
    ckpt.write_manifest(tmp_path, 2, {**config.identity(), "seed": 7}, world_size=4)
    with pytest.raises(CheckpointError, match="seed is 7 there, 0 now"):
        check_resumable(config)
