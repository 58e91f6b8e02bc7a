"""An adaptive-local-steps run (A100 + T4, the T4's compute at its speed) reports by the run's progress, one launch:
its validations are one per sync labelled by the run's completed steps (not each rank's own step count), every
metrics line carries the lr the worker set (read at the run's progress) and no progress past --steps, the report's
rows are the run's steps with no per-row comm error, and the last line of each rank holds the end's landing (its
inter-region bytes are what the rank sent between its first step's start and its last line's end)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from geotrain.cluster import load_cluster
from geotrain.models import lr_at
from geotrain.observe.metrics import read_metrics, steps_of
from geotrain.runtime import RuntimeConfig, launch
from two_gpus import TWO_GPUS_YAML

STEPS, H, LR = 8, 4, 3e-3


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uneven")
    (tmp / "cluster.yaml").write_text(TWO_GPUS_YAML)
    config = RuntimeConfig.of(load_cluster(str(tmp / "cluster.yaml")), np.array([[0, 1]]), steps=STEPS, sync_every=H,
                              local_steps="adaptive", outer_lr=1.0, outer_momentum=0.0, emulate_gpu_speed=True,
                              time_scale=1e-3, eval_every=H, batch_size=2, microbatches=1, model_name="tiny-2layer",
                              lr=LR, run_dir=str(tmp / "run"))
    result = launch(config)
    assert result.exit_code == 0
    return result.report, steps_of(read_metrics(tmp / "run")), tmp / "run"


@pytest.mark.timeout(300)
def test_validations_are_one_per_sync_labelled_by_the_runs_completed_steps(adaptive_run):
    report, lines, _ = adaptive_run
    own = {rank: sum(1 for s in lines if s["rank"] == rank) for rank in range(2)}
    assert own[0] > own[1]  # the A100 takes more steps: its own count would label its evaluations past STEPS
    assert [step for step, _ in report.validation] == [H, STEPS]
    assert report.replica_validation == ()
    # both ranks scored the same global model after each sync
    for step in (H, STEPS):
        losses = {s["val_loss"] for s in lines if s["val_loss"] is not None and s["progress_step"] // H == step // H - 1}
        assert len(losses) == 1


@pytest.mark.timeout(300)
def test_each_line_has_the_lr_the_worker_set_at_the_runs_progress(adaptive_run):
    _, lines, _ = adaptive_run
    for rank in range(2):
        mine = sorted((s for s in lines if s["rank"] == rank), key=lambda s: s["step"])
        progress = [s["progress_step"] for s in mine]
        assert progress == sorted(progress) and progress[0] == 0 and progress[-1] <= STEPS - 1
        assert [s["lr"] for s in mine] == pytest.approx([lr_at(p, STEPS, LR) for p in progress])
    # the A100's last steps stand near the run's end: its own step count would read the schedule's floor earlier
    last = max((s for s in lines if s["rank"] == 0), key=lambda s: s["step"])
    assert last["step"] > STEPS - 1 and last["lr"] == pytest.approx(lr_at(last["progress_step"], STEPS, LR))


@pytest.mark.timeout(300)
def test_rows_are_the_runs_steps_and_the_last_line_holds_the_ends_landing(adaptive_run):
    report, lines, run_dir = adaptive_run
    assert [row.step for row in report.rows] == list(range(STEPS))
    assert all(row.error_pct is None for row in report.rows)
    for rank in range(2):
        mine = [s for s in lines if s["rank"] == rank]
        start, end = min(s["emulated_start_s"] for s in mine), max(s["emulated_end_s"] for s in mine)
        sent = json.loads((run_dir / "emulator" / f"rank-{rank}.json").read_text())["transfers"]
        inter = sum(t["nbytes"] for t in sent if t["src_device"] != t["dst_device"] and start <= t["start_s"] <= end)
        # all but the evaluations' 8-byte loss all-reduces, which run between steps (the syncs: 1.2 MB each)
        assert sum(s["bytes_inter"] for s in mine) == pytest.approx(inter, abs=64) and inter > 1e6
