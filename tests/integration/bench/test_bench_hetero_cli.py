"""`geotrain bench hetero --json`: the JSON contract (one row per kind with its fields), on a short run of the
adaptive row and the limit; adaptive rows see the same samples as the others (R x H steps per period)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ROW_KEYS = {"kind", "label", "time_to_target_s", "val_loss", "site_compute_fraction", "inter_region_bytes",
            "predicted_step_s"}


@pytest.mark.timeout(400)
def test_bench_hetero_json_has_the_contract_fields_for_the_adaptive_and_limit_rows(tmp_path):
    done = subprocess.run([sys.executable, "-m", "geotrain", "bench", "hetero", "--steps", "10",
                           "--rows", "diloco-adaptive", "--json", "--run-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=380)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert [row["kind"] for row in doc["rows"]] == ["diloco-adaptive", "limit"]
    sites = {"oregon", "virginia", "frankfurt", "tokyo"}
    for row in doc["rows"]:
        assert ROW_KEYS <= set(row)
        assert set(row["site_compute_fraction"]) == sites
        assert all(0 < f <= 1 for f in row["site_compute_fraction"].values())
        assert row["time_to_target_s"] is None or row["time_to_target_s"] > 0
    adaptive, limit = doc["rows"]
    assert sum(adaptive["inner_steps"].values()) == sum(limit["inner_steps"].values()) == 10 * 4
    # DDP (the limit's run) sends the model every step, DiLoCo int8 outer deltas every 5
    assert limit["inter_region_bytes"] > adaptive["inter_region_bytes"] > 0
    assert len(adaptive["curve"]["val_loss"]) == 2  # one score after each of the 2 outer periods
    # --run-dir: each row's run directory, one metrics line per rank per inner step, read back by `geotrain report`
    from geotrain.observe.metrics import read_metrics, steps_of

    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["diloco-adaptive", "limit"]
    steps = steps_of(read_metrics(tmp_path / "runs" / "diloco-adaptive"))
    assert sorted(adaptive["inner_steps"].values()) == sorted(
        sum(1 for s in steps if s["rank"] == rank) for rank in range(4))
    report = subprocess.run([sys.executable, "-m", "geotrain", "report", str(tmp_path / "runs" / "limit"), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    assert {rank["site"] for rank in json.loads(report.stdout)["split"]["ranks"]} == sites
