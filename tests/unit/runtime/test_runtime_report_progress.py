"""The run report of uneven runs (adaptive local steps, asynchronous outer updates: each rank's step indices are
its own) from synthetic worker records: validations labelled by the run's progress, once per evaluation of the
global model (a replica's own evaluations apart, labelled by replica), one row per step of the run's progress and
none past --steps, no per-row comm error, and an asynchronous exchange counted as communication."""

from __future__ import annotations

import pytest

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig
from geotrain.runtime.report import build_report
from geotrain.runtime.report_progress import progress_step_s, validations
from geotrain.sync.async_step import progress_steps
from two_gpus import TWO_GPUS_YAML

STEPS, H = 16, 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = tmp_path_factory.mktemp("cluster") / "two-gpus.yaml"
    path.write_text(TWO_GPUS_YAML)
    return load_cluster(str(path))


def record(replica: int, step: int, progress: int, start: float, end: float, **extra: object) -> dict:
    return {"step": step, "rank": replica, "stage": 0, "replica": replica, "loss": 3.0 - 0.01 * progress,
            "samples": 2, "lr": 1e-3, "progress_step": progress, "compute_s": 0.01, "iteration_s": 0.02,
            "dp_s": 0.0, "dp_emulated_s": 0.0, "dp_bytes": 0, "grad_norm": None, "param_sum": 1.0, "pp_bytes": 0,
            "val_loss": None, "boundaries": [0, 4], "transfers": [],
            "emulated": {"start_s": start, "end_s": end, "bytes": 0.0, "inter_region_bytes": 0.0,
                         "inter_region_wire": []}, **extra}


def adaptive_records() -> list[dict]:
    """The A100 replica takes 7 steps a period, the T4 one 1 (R x H = 8), over STEPS / H periods; each period's
    last step syncs and, every period (--eval-every 4), scores the global model: both ranks record the same loss."""
    records = []
    for replica, per_period in ((0, 7), (1, 1)):
        step = 0
        for period in range(STEPS // H):
            for i in range(per_period):
                last = i == per_period - 1
                start = period + i / per_period
                records.append(record(replica, step, period * H + i * H // per_period, start, start + 1 / per_period,
                                      outer_step=period + last, local_steps=per_period, syncs_landed=period + last,
                                      val_loss=2.5 - 0.1 * period if last else None))
                step += 1
    return records


def async_records() -> list[dict]:
    """R = 2, H = 4, budget 8 replica updates: replica 0 pushes 8 times (32 steps), replica 1 once (4 steps) at the
    end; replica 0 scores each global model it receives (--eval-local), every rank the final one at the end."""
    records = []
    for step in range(32):
        updates_before = step // H
        records.append(record(0, step, min(STEPS - 1, progress_steps(updates_before, H, 2)), 0.1 * step,
                              0.1 * step + 0.1, global_updates=updates_before + (step % H == H - 1),
                              exchange_s=0.5 if step % H == H - 1 else 0.0,
                              val_loss=(2.0 if step == 31 else 2.9 - 0.01 * step) if step % H == H - 1 else None))
    for step in range(4):
        records.append(record(1, step, 0, 0.8 * step, 0.8 * step + 0.8, global_updates=8 if step == 3 else 0,
                              exchange_s=0.5 if step == 3 else 0.0, val_loss=2.0 if step == 3 else None))
    return records


def test_adaptive_validations_are_one_per_sync_labelled_by_the_runs_completed_steps():
    # each rank's own step count would label them 1, 2, 3, 4 (the T4) and 7, 14, 21, 28 (the A100)
    scored, alone = validations(adaptive_records(), STEPS, H, 2)
    assert scored == [(4, pytest.approx(2.5)), (8, pytest.approx(2.4)), (12, pytest.approx(2.3)),
                      (16, pytest.approx(2.2))]
    assert alone == []


def test_async_validations_label_the_final_model_by_the_runs_steps_and_a_replicas_own_by_replica():
    scored, alone = validations(async_records(), STEPS, H, 2)
    assert scored == [(STEPS, pytest.approx(2.0))]  # both ranks score the final global model once, at the end
    # replica 0 scored the global model after each of its first 7 updates: k updates x H / R steps of the run
    assert alone == [(0, 2 * k, pytest.approx(2.9 - 0.01 * (4 * k - 1))) for k in range(1, 8)]


@pytest.mark.parametrize("records", [adaptive_records, async_records], ids=["adaptive", "async"])
def test_uneven_rows_are_the_runs_progress_steps_and_none_past_the_run(cluster, records):
    uneven = dict(local_steps="adaptive") if records is adaptive_records else dict(outer_sync="async")
    config = RuntimeConfig.of(cluster, [[0, 1]], steps=STEPS, sync_every=H, time_scale=1e-3, **uneven)
    report = build_report(config, records())
    steps = [row.step for row in report.rows]
    assert steps == sorted(steps) and steps[-1] <= STEPS - 1
    # adaptive: every progress step has a row; async: the global model moves by H / R = 2 steps an update
    assert steps == (list(range(STEPS)) if records is adaptive_records else list(range(0, STEPS, 2)))
    assert all(row.error_pct is None for row in report.rows)  # a sync falls in some rows only: no per-row error
    assert all(entry["error_pct"] is None for entry in report.to_json()["iterations"])
    assert report.uneven and report.to_json()["rows_by"] == "progress"


def test_an_async_row_counts_the_exchange_as_dp_communication_and_the_slowest_ranks_seconds(cluster):
    config = RuntimeConfig.of(cluster, [[0, 1]], steps=STEPS, sync_every=H, time_scale=1e-3, outer_sync="async")
    report = build_report(config, async_records())
    first = report.rows[0]
    # progress step 0: replica 0's first 4 steps (one exchange of 0.5 emulated s) and all 4 of replica 1's (one)
    assert first.dp_measured_s == pytest.approx(0.5 * 1e-3)  # emulated seconds x the time scale
    assert first.iteration_s == pytest.approx(4 * 0.02) and first.compute_s == pytest.approx(4 * 0.01)
    assert report.replicas_in_sync  # both end on the final global model (param_sum 1.0)


def test_an_uneven_runs_step_is_its_emulated_span_from_the_loops_start_over_its_steps():
    # adaptive_records: the earliest start 0.0, the latest end 4.0 (period 3's last steps)
    assert progress_step_s(adaptive_records(), STEPS) == pytest.approx(4.0 / STEPS)
