"""Runtime pieces that need no worker processes: link emulation, transport timing, prediction,
layout, schedules, stage split, checkpoints, watchdog, config validation."""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import make_network
from geotrain.cost import YuanCostModel
from geotrain.models import GPTConfig, make_model
from geotrain.runtime import (
    CheckpointError,
    Layout,
    LinkModel,
    LinkQueue,
    RuntimeConfig,
    RuntimeConfigError,
    busy_seconds,
    layer_ranges,
    parse_codec_spec,
    predict_comm,
    real_bytes_job,
    schedule_order,
    split_model,
)
from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime.transport import Transport, delivery
from geotrain.runtime.watchdog import EXIT_PEER_LOST, Watchdog

GEO = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0)  # 10 Mbit/s, 20 ms between regions


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny tensors: one thread is fastest, and spinning OpenMP threads crawl on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- link emulation -------------------------------------------------------------------------------

def test_transfer_time_is_latency_plus_bytes_over_bandwidth_times_scale():
    links = LinkModel.from_cluster(GEO, time_scale=0.5)
    # devices 0 and 2 are in different regions: 20 ms, 0.01 Gbit/s
    assert links.transfer_s(0, 2, 1_000_000) == pytest.approx(0.5 * (0.020 + 8e6 / 1e7))
    assert links.transfer_s(0, 1, 1_000_000) == pytest.approx(0.5 * (0.0001 + 8e6 / 1e10))
    assert links.transfer_s(3, 3, 1e9) == 0.0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=4, unique=True), st.integers(1, 10**7))
def test_emulated_allreduce_is_the_yuan_dp_term(devices, nbytes):
    stages, replicas = 1, len(devices)
    links = LinkModel.from_cluster(GEO, time_scale=1.0)
    model = YuanCostModel(GEO, real_bytes_job(nbytes, 1, stages, replicas), stages, replicas)
    expected = float(model.stage_dp_seconds(np.array([devices]))[0])
    assert links.allreduce_s(devices, nbytes) == pytest.approx(expected, rel=1e-12)


def test_link_queue_pays_latency_once_for_back_to_back_messages():
    links = LinkModel.from_cluster(GEO, time_scale=1.0)
    queue = LinkQueue(links, 0, 2)
    per_message = 8 * 100_000 / 1e7
    arrivals = [queue.arrival(100_000, handoff_t=0.0) for _ in range(4)]
    assert arrivals == pytest.approx([0.020 + per_message * (k + 1) for k in range(4)])
    spaced = LinkQueue(links, 0, 2)
    assert spaced.arrival(100_000, 0.0) == pytest.approx(0.020 + per_message)
    assert spaced.arrival(100_000, 10.0) == pytest.approx(10.0 + 0.020 + per_message)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 10)), max_size=12))
def test_busy_seconds_is_the_length_of_the_union(raw):
    intervals = [(float(start), float(start + length)) for start, length in raw]
    covered = np.zeros(60, dtype=bool)
    for start, end in intervals:
        covered[int(start):int(end)] = True
    assert busy_seconds(intervals) == pytest.approx(float(covered.sum()))


# -- transport timing, over an in-memory backend and a fake clock ------------------------------------

class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class LoopbackBackend:
    """Messages between Transport objects of one process, matched by (src, dst, tag)."""

    def __init__(self) -> None:
        self.queues: dict[tuple[int, int, int], list[torch.Tensor]] = defaultdict(list)
        self.rank = 0

    def for_rank(self, rank: int) -> Any:
        backend = self

        class View:
            def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Any:
                backend.queues[(rank, dst, tag)].append(tensor.clone())
                return type("Done", (), {"wait": lambda self: None})()

            def recv(self, tensor: torch.Tensor, src: int, tag: int) -> None:
                tensor.copy_(backend.queues[(src, rank, tag)].pop(0))

            def barrier(self, group: Any) -> None:
                pass

        return View()


def _transports(time_scale: float) -> tuple[Transport, Transport, FakeClock]:
    layout = Layout(np.array([[0], [2]]))  # 2 stages x 1 replica: rank 0 on device 0, rank 1 on device 2
    links = LinkModel.from_cluster(GEO, time_scale)
    clock, loop = FakeClock(), LoopbackBackend()
    make = lambda rank: Transport(layout, links, rank, loop.for_rank(rank), clock=clock, sleep=clock.sleep)  # noqa: E731
    return make(0), make(1), clock


def test_receiver_sleeps_until_the_emulated_arrival():
    sender, receiver, clock = _transports(time_scale=0.5)
    payload = torch.arange(200_000, dtype=torch.int64).to(torch.uint8)
    sender.send(payload, dst_rank=1, tag=0)
    received = receiver.recv(payload.numel(), src_rank=0, tag=0, kind="fwd", cut=0, micro=0)
    assert torch.equal(received, payload)
    expected = 0.5 * (0.020 + 8 * 200_000 / 1e7)
    assert clock.slept == [pytest.approx(expected)]
    record = receiver.transfers[0]
    assert record.end_t - record.handoff_t == pytest.approx(expected)
    assert record.nbytes == 200_000


def test_late_receiver_is_charged_arrival_plus_copy_time_not_its_lateness():
    assert delivery(posted_t=0.0, received_t=0.1, arrival_t=1.0) == (pytest.approx(0.9), 1.0)
    assert delivery(posted_t=0.0, received_t=1.5, arrival_t=1.0) == (0.0, 1.5)  # real transfer slower
    sleep_s, end = delivery(posted_t=5.0, received_t=5.25, arrival_t=1.0)
    assert sleep_s == 0.0 and end == pytest.approx(1.25)


def test_collective_sleeps_out_the_emulated_allreduce():
    sender, _receiver, clock = _transports(time_scale=2.0)
    result = sender.collective(None, [0, 2, 3], 300_000, lambda: "reduced")
    expected = LinkModel.from_cluster(GEO, 2.0).allreduce_s([0, 2, 3], 300_000)
    assert result == "reduced"
    assert clock.slept == [pytest.approx(expected)]
    assert sender.collectives[0].seconds == pytest.approx(expected)


# -- prediction ----------------------------------------------------------------------------------

def test_real_bytes_job_reproduces_the_bytes_exactly():
    job = real_bytes_job(1_657_856, 393_216, stages=2, replicas=4)
    assert job.dp_bytes(2) == 1_657_856 and job.pp_bytes(4) == 393_216


def test_prediction_equals_the_yuan_model_for_uniform_bytes():
    assignment = np.array([[0, 2], [1, 3]])
    prediction = predict_comm(GEO, assignment, [500_000, 500_000], 200_000, time_scale=0.1)
    cost = YuanCostModel(GEO, real_bytes_job(500_000, 200_000, 2, 2), 2, 2).evaluate(assignment)
    assert prediction.dp_s == pytest.approx(0.1 * cost.dp) and prediction.pp_s == pytest.approx(0.1 * cost.pp)
    uneven = predict_comm(GEO, assignment, [500_000, 2_000_000], 200_000, time_scale=0.1)
    assert uneven.dp_per_stage_s[1] > uneven.dp_per_stage_s[0] and uneven.dp_s == uneven.dp_per_stage_s[1]


# -- layout, schedules, stage split ------------------------------------------------------------------

@given(st.integers(1, 12), st.integers(1, 12))
def test_layer_ranges_are_contiguous_balanced_and_cover_all_blocks(n_layers, stages):
    if stages > n_layers:
        with pytest.raises(ValueError):
            layer_ranges(n_layers, stages)
        return
    ranges = layer_ranges(n_layers, stages)
    assert ranges[0][0] == 0 and ranges[-1][1] == n_layers
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [stop - start for start, stop in ranges]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_layout_ranks_groups_and_neighbours():
    layout = Layout(np.array([[4, 5, 6], [0, 1, 2]]))
    assert [layout.slot(r).device for r in range(6)] == [4, 5, 6, 0, 1, 2]
    assert layout.dp_group_ranks(1) == [3, 4, 5] and layout.dp_group_devices(0) == [4, 5, 6]
    assert layout.next_rank(1) == 4 and layout.prev_rank(4) == 1 and layout.prev_rank(1) is None


@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 5), st.integers(1, 8))
def test_schedules_run_each_microbatch_forward_then_backward_once(kind, stages, microbatches):
    for stage in range(stages):
        order = schedule_order(kind, stage, stages, microbatches)
        assert sorted(order) == sorted([("F", m) for m in range(microbatches)] + [("B", m) for m in range(microbatches)])
        assert all(order.index(("F", m)) < order.index(("B", m)) for m in range(microbatches))
        in_flight = max(sum(1 for op, _ in order[:i + 1] if op == "F") - sum(1 for op, _ in order[:i + 1] if op == "B")
                        for i in range(len(order)))
        assert in_flight == (microbatches if kind == "gpipe" else min(stages - stage, microbatches))


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_stage_split_gives_the_unsplit_models_logits_and_gradients(stages):
    config = GPTConfig(n_layer=4)
    full, split_source = make_model(config, seed=3), make_model(config, seed=3)
    idx = torch.randint(0, config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    hidden = idx
    parts = split_model(split_source, stages)
    for part in parts:
        hidden = part(hidden)
    expected = full(idx)
    assert torch.equal(hidden, expected)
    hidden.square().mean().backward()
    expected.square().mean().backward()
    for (name, a), (_, b) in zip(full.named_parameters(), split_source.named_parameters()):
        assert torch.equal(a.grad, b.grad), name
    owned = [id(p) for part in parts for p in part.parameters()]
    assert sorted(owned) == sorted(id(p) for p in split_source.parameters())  # every weight in exactly one stage


# -- checkpoints ---------------------------------------------------------------------------------

def test_checkpoint_manifest_latest_pointer_and_identity(tmp_path):
    identity = {"seed": 1, "stages": 2}
    for rank in range(2):
        ckpt.save_shard(tmp_path, 3, rank, {"slot": {"rank": rank}, "completed": 3, "x": torch.full((2,), float(rank))})
    assert ckpt.latest_step(tmp_path) is None  # shards without a manifest are not a checkpoint
    ckpt.write_manifest(tmp_path, 3, identity, world_size=2)
    assert ckpt.latest_step(tmp_path) == 3
    manifest = ckpt.read_manifest(tmp_path, 3)
    assert torch.equal(ckpt.load_shard(tmp_path, 3, 1, manifest, {"rank": 1})["x"], torch.ones(2))
    ckpt.save_shard(tmp_path, 6, 0, {"completed": 6})
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


# -- configuration -------------------------------------------------------------------------------

def test_codec_specs_parse_names_and_typed_parameters():
    assert parse_codec_spec("fp16") == ("fp16", {})
    assert parse_codec_spec("topk:fraction=0.01,value_dtype=fp16") == ("topk", {"fraction": 0.01, "value_dtype": "fp16"})
    with pytest.raises(RuntimeConfigError, match="key=value"):
        parse_codec_spec("topk:0.01")


@pytest.mark.parametrize("change, message", [
    ({"microbatches": 3}, "batch_size must be a positive multiple of microbatches"),
    ({"pp_codec": "topk"}, "pipeline codec must be one of"),
    ({"assignment": np.array([[0, 0], [1, 3]])}, "device 0 is used more than once"),
    ({"assignment": np.array([[0, 2], [1, 4]])}, "device index must be in 0..3"),
    ({"assignment": np.array([[0], [1], [2], [3]]), "model": GPTConfig(n_layer=3)}, "cannot split 3"),
    ({"resume": True}, "resume needs a checkpoint directory"),
    ({"time_scale": -1.0}, "time_scale must be a finite number >= 0"),
    ({"dp_codec": "topk:k=3"}, "codec 'topk' has no parameter"),
])
def test_config_rejects_bad_options_with_the_value(change, message):
    base = {"cluster": GEO, "assignment": np.array([[0, 2], [1, 3]])}
    with pytest.raises(ValueError, match=message):
        RuntimeConfig(**{**base, **change})


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

    config = RuntimeConfig(cluster=GEO, assignment=np.array([[0, 2], [1, 3]]), checkpoint_dir=str(tmp_path), resume=True)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        check_resumable(config)
    for rank in range(4):
        ckpt.save_shard(tmp_path, 2, rank, {})
    ckpt.write_manifest(tmp_path, 2, {**config.identity(), "seed": 7}, world_size=4)
    with pytest.raises(CheckpointError, match="seed is 7 there, 0 now"):
        check_resumable(config)
