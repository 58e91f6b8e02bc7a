"""`geotrain bench hetero --json`: the JSON contract (one row per kind with its fields), on a short run of the
asynchronous row, the planner's recipe row and the limit; the recipe (adaptive local steps on these GPUs) sees the same
samples as the others (R x H steps per period); the async row runs on the emulated links; the planner's predictions
sit beside the measured step. (The diloco-adaptive row runs the recipe's code path with fixed settings: not launched
here, to keep the suite's time.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ROW_KEYS = {"kind", "label", "time_to_target_s", "val_loss", "site_compute_fraction", "inter_region_bytes",
            "predicted_step_s", "measured_step_s", "predicted_site_compute_fraction"}


@pytest.mark.timeout(400)
def test_bench_hetero_json_has_the_contract_fields_for_the_adaptive_async_recipe_and_limit_rows(tmp_path):
    # 10 steps (2 outer periods of H = 5) of 16 sequences (the default 32 only doubles the workers' compute: no
    # assertion depends on the batch; 4 per replica, one per micro-batch)
    done = subprocess.run([sys.executable, "-m", "geotrain", "bench", "hetero", "--steps", "10", "--global-batch", "16",
                           "--rows", "async,recipe", "--json", "--run-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=380)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["skipped"] == [] and [row["kind"] for row in doc["rows"]] == ["async", "recipe", "limit"]
    sites = {"oregon", "virginia", "frankfurt", "tokyo"}
    for row in doc["rows"]:
        assert ROW_KEYS <= set(row)
        assert set(row["site_compute_fraction"]) == sites
        assert all(0 < f <= 1 for f in row["site_compute_fraction"].values())
        assert row["time_to_target_s"] is None or row["time_to_target_s"] > 0
    asynchronous, recipe, limit = doc["rows"]
    _check_async_row(asynchronous)
    # the planner prices the adaptive and recipe rows from the limit's measured compute; the limit is not priced
    assert limit["predicted_step_s"] is None and limit["predicted_site_compute_fraction"] is None
    assert recipe["predicted_step_s"] > 0 and set(recipe["predicted_site_compute_fraction"]) == sites
    assert recipe["measured_step_s"] == pytest.approx(recipe["elapsed_s"] / 10)
        # (predicted against measured is a benchmark number, docs/results/bench-hetero.md: no timed assertion here)
    # the recipe row ran the plan: on these GPUs adaptive local steps, the planner's H_r at first, R x H a period
    plan = recipe["recipe"]
    assert plan["local_steps"] == "adaptive" and recipe["options"]["local_steps"] == "adaptive"
    assert plan["local_steps_step_s"]["adaptive"] < plan["local_steps_step_s"]["equal"]
    assert sum(recipe["inner_steps"].values()) == 10 * 4
    assert recipe["predicted_site_compute_fraction"] == pytest.approx(
        dict(zip(["oregon", "virginia", "frankfurt", "tokyo"], plan["replica_compute_fraction"])))
    assert sum(limit["inner_steps"].values()) == 10 * 4
    # DDP (the limit's run) sends the model every step, the recipe's DiLoCo its outer deltas every period
    assert limit["inter_region_bytes"] > recipe["inter_region_bytes"] > 0
    assert recipe["curve"]["val_loss"]  # scored on its way
    # --run-dir: each row's run directory, one metrics line per rank per inner step, read back by `geotrain report`
    from geotrain.observe.metrics import read_metrics, steps_of

    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["async", "limit", "recipe"]
    steps = steps_of(read_metrics(tmp_path / "runs" / "recipe"))
    assert sorted(recipe["inner_steps"].values()) == sorted(
        sum(1 for s in steps if s["rank"] == rank) for rank in range(4))
    report = subprocess.run([sys.executable, "-m", "geotrain", "report", str(tmp_path / "runs" / "limit"), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    assert {rank["site"] for rank in json.loads(report.stdout)["split"]["ranks"]} == sites



def _check_async_row(row: dict) -> None:
    # the server serves in emulated time: the A100 site (oregon) takes more inner steps than the T4 (tokyo), and the
    # run's 2 x 4 outer gradients of H = 5 steps hold at least the equal rows' 10 x 4 inner steps
    steps = row["inner_steps"]
    assert steps["oregon"] > steps["tokyo"] and sum(steps.values()) >= 10 * 4
    assert row["inter_region_bytes"] > 0 and row["predicted_step_s"] > 0  # fp32 models cross; the planner prices it
    # every rank scores the global model it gets back, timed when its server sent it: the last is the final model,
    # sent before the run's end (its arrival at the farthest rank)
    curve = row["curve"]
    assert curve["time_s"] == sorted(curve["time_s"]) and 0 < curve["time_s"][-1] < row["elapsed_s"]
    assert row["val_loss"] == pytest.approx(curve["val_loss"][-1], abs=1e-6)
