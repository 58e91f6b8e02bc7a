"""`geotrain bench runtime --run-dir DIR`: each of its three plans writes a run directory under DIR, named by
the plan's label, read back by `geotrain report`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def test_bench_runtime_writes_a_run_directory_per_plan(tmp_path):
    command = [sys.executable, "-m", "geotrain", "bench", "runtime", "--devices-per-region", "1", "--stages", "1",
               "--replicas", "2", "--steps", "2", "--microbatches", "1", "--time-scale", "0.01", "--json",
               "--run-dir", "runs"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=tmp_path, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["crossing", "planned", "random"]
    for label in ("planned", "random", "crossing"):
        run = tmp_path / "runs" / label
        steps = [json.loads(line) for path in (run / "metrics").glob("rank-*.jsonl")
                 for line in path.read_text().splitlines() if '"kind":"step"' in line]
        assert sorted((r["rank"], r["step"]) for r in steps) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert all(r["comm_s"] > 0 and r["bytes_dp"] > 0 for r in steps)
        assert json.loads((run / "run.json").read_text())["plan"] == label
        assert any(e.get("cat") == "step" for e in json.loads((run / "trace.json").read_text())["traceEvents"])
    assert not (tmp_path / "geotrain-runs").exists()
