"""Real multi-process training runs (gloo on localhost, 2 stages x 2 replicas) through runtime.launch:
prediction vs measurement, determinism, resume, codecs, schedules. Every run is bounded by the
launcher's failure detection and by pytest-timeout."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from geotrain.cluster import make_network
from geotrain.data import world_tokens
from geotrain.runtime import RuntimeConfig, WorkerFailure, launch
from geotrain.runtime.bench import RuntimeBenchConfig, payload_bytes

pytestmark = pytest.mark.timeout(300)

# Two regions of two devices; 10 Gbit/s, 0.1 ms inside, 10 Mbit/s and 20 ms between: bandwidth-bound.
CLUSTER = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0, name="test-2x2")
DP_CROSSES = np.array([[0, 2], [1, 3]])  # each pipeline inside a region, each DP group across
PP_CROSSES = np.array([[0, 1], [2, 3]])  # each DP group inside a region, each pipeline across


@pytest.fixture(scope="module")
def tokens():
    return world_tokens(0)


def _run(tokens, assignment=DP_CROSSES, **options):
    options = {"steps": 4, "time_scale": 0.0, "heartbeat_timeout_s": 20.0, **options}
    return launch(RuntimeConfig.of(cluster=CLUSTER, assignment=assignment, **options), tokens=tokens).report


@pytest.mark.slow
@pytest.mark.parametrize("assignment, codecs", [
    (DP_CROSSES, {}),
    (PP_CROSSES, {"dp_codec": "fp16", "pp_codec": "bf16"}),
], ids=["dp-crosses-fp32", "pp-crosses-fp16-bf16"])
def test_cost_model_predicts_the_measured_communication_within_20_percent(tokens, assignment, codecs):
    report = _run(tokens, assignment, steps=3, time_scale=1.0, **codecs)
    summary = report.summary()
    assert summary["comm_predicted_s"] > 0.3  # emulated link time dominates real per-message overheads
    assert abs(summary["error_pct"]) < 20.0, summary
    assert summary["comm_measured_s"] >= 0.95 * summary["comm_predicted_s"]  # emulation never runs fast
    assert report.replicas_in_sync
    predicted = summary["iteration_predicted_s"]
    assert set(predicted) == {"schedule", "ring", "yuan"}
    assert "iteration_predicted_links_s" not in summary  # emulated: the links are in iteration_predicted_s
    assert predicted["schedule"] > summary["comm_predicted_s"] * 0.5  # the links are in it, scaled as measured
    assert summary["iteration_error_pct"]["schedule"] == pytest.approx(
        100 * (summary["iteration_s"] - predicted["schedule"]) / predicted["schedule"])
    bytes_per_value = 2 if codecs else 4
    assert report.pp_bytes_per_cut == 8 * 96 * 128 * bytes_per_value  # batch 8 x context 96 x d_model 128
    expected = payload_bytes(RuntimeBenchConfig(devices_per_region=2, stages=2, replicas=2, **codecs))
    assert (report.dp_bytes_per_stage, report.pp_bytes_per_cut) == expected  # what the bench's planner scores


def test_same_seed_same_losses_resume_equals_uninterrupted_and_loss_decreases(tokens, tmp_path):
    options = {"steps": 6, "dp_codec": "topk:fraction=0.05", "pp_codec": "bf16", "time_scale": 0.01}
    uninterrupted = _run(tokens, **options)
    first_half = _run(tokens, **options, stop_after=3, checkpoint_dir=str(tmp_path))
    resumed = _run(tokens, **options, resume=True, checkpoint_dir=str(tmp_path))
    assert first_half.losses == uninterrupted.losses[:3]  # two launches, same seed: bit for bit
    assert resumed.losses == uninterrupted.losses  # weights, AdamW moments, error-feedback residuals restored
    assert uninterrupted.losses[-1] < uninterrupted.losses[0] - 0.3
    assert uninterrupted.replicas_in_sync and resumed.replicas_in_sync
    other_seed = _run(tokens, **{**options, "steps": 2}, seed=1)
    assert other_seed.losses[0] != uninterrupted.losses[0]


@pytest.mark.slow
def test_powersgd_gradients_resume_exactly_and_send_a_fraction_of_fp32(tokens, tmp_path):
    options = {"steps": 4, "dp_codec": "powersgd:rank=2"}
    uninterrupted = _run(tokens, **options)
    _run(tokens, **options, stop_after=2, checkpoint_dir=str(tmp_path))
    resumed = _run(tokens, **options, resume=True, checkpoint_dir=str(tmp_path))
    assert resumed.losses == uninterrupted.losses  # shared Q's and residuals restored
    assert uninterrupted.replicas_in_sync  # every replica applies the same low-rank mean
    assert uninterrupted.losses[-1] < uninterrupted.losses[0]
    fp32 = _run(tokens, steps=1)
    ratio = [p / f for p, f in zip(uninterrupted.dp_bytes_per_stage, fp32.dp_bytes_per_stage, strict=True)]
    assert max(ratio) < 0.1, ratio


@pytest.mark.slow
def test_1f1b_schedule_trains_like_gpipe(tokens):
    gpipe = _run(tokens, steps=3, schedule="gpipe")
    one_f_one_b = _run(tokens, steps=3, schedule="1f1b")
    # Same micro-batches, same math; only the order gradients accumulate in differs.
    assert one_f_one_b.losses == pytest.approx(gpipe.losses, rel=1e-5)
    assert one_f_one_b.replicas_in_sync
    # no emulation (real links: netlab, real hosts): the models also predict with the cluster's links at
    # face value and the measured compute; here each DP group all-reduces ~1.6 MB over 10 Mbit/s
    summary = gpipe.summary()
    links = summary["iteration_predicted_links_s"]
    assert set(links) == {"schedule", "ring", "yuan"}
    assert links["schedule"] > summary["iteration_predicted_s"]["schedule"] + 1.0
    assert summary["iteration_links_error_pct"]["schedule"] == pytest.approx(
        100 * (summary["iteration_s"] - links["schedule"]) / links["schedule"])
    assert "iteration_predicted_emulated_s" not in summary


def _worker_pid(rank: int, timeout_s: float = 120.0) -> int:
    """The pid of this test process's worker of `rank`: a descendant (workers are forks of our fork
    server) named geotrain-r<rank>."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit():
                    parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
        family, frontier = set(), {os.getpid()}
        while frontier:
            frontier = {pid for pid, parent in parents.items() if parent in frontier} - family
            family |= frontier
        for pid in family:
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == f"geotrain-r{rank}":
                    return pid
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no worker geotrain-r{rank} appeared")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/comm").exists(), reason="needs Linux /proc")
def test_a_hung_worker_is_named_and_killed_in_bounded_time(tokens):
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            _run(tokens, steps=500, time_scale=0.05, heartbeat_timeout_s=3.0)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    pid = _worker_pid(2)
    time.sleep(3.0)  # let it train a little
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)  # a hang: alive, silent
    thread.join(timeout=60)
    elapsed = time.monotonic() - stopped_at
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), WorkerFailure)
    message = str(outcome["error"])
    assert message.startswith("rank 2 (stage 1, replica 0, device 1 region0-1) stopped responding (hung; killed by the launcher)")
    assert "lost rank 2 (stage 1, replica 0, device 1 region0-1): no heartbeat for 3 s" in message
    assert elapsed < 20, f"{elapsed:.1f} s"
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
