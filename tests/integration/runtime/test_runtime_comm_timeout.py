"""A replica slowed 100,000x after 1 s of training, --comm-timeout 5, one launch: the run ends about 5 s after the
slow-down (not after torch's 30 minutes for a new group), in one line naming the rank that held the collective up,
and each rank's metrics file holds its step lines and a "failure" event saying why it ended: rank 0 by the
timeout, rank 1 (alive, its heartbeat going on) by the watchdog's os._exit after rank 0's abort notice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from paths import ROOT
from two_gpus import TWO_GPUS_YAML

GEOTRAIN = [sys.executable, "-m", "geotrain"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
COMM_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def stuck_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("comm-timeout")
    (tmp / "cluster.yaml").write_text(TWO_GPUS_YAML)
    (tmp / "plan.json").write_text(json.dumps({"method": "manual", "stages": 1, "replicas": 2, "assignment": [[0, 1]]}))
    started = time.monotonic()
    done = subprocess.run([*GEOTRAIN, "train", "--cluster", "cluster.yaml", "--plan", "plan.json", "--steps", "40",
                           "--time-scale", "0", "--chaos", "slow:site=1,factor=100000,at=1s",
                           "--comm-timeout", str(COMM_TIMEOUT_S), "--run-dir", "run"],
                          capture_output=True, text=True, timeout=600, cwd=tmp, env=ENV)
    wall_s = time.monotonic() - started

    def lines(rank):
        return [json.loads(line) for line in (tmp / "run" / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()]

    return done, wall_s, {rank: lines(rank) for rank in range(2)}


@pytest.mark.timeout(600)
def test_a_stuck_rank_ends_the_run_at_the_comm_timeout_naming_it(stuck_run):
    done, wall_s, records = stuck_run
    # without the group timeout rank 0 would wait out rank 1's hours-long step (torch's default: 30 minutes)
    first_step = min(r["t_wall"] for r in records[0] if r["kind"] == "step")
    failed = next(r["t_wall"] for r in records[0] if r.get("event") == "failure")
    assert COMM_TIMEOUT_S < failed - first_step < COMM_TIMEOUT_S + 8 and wall_s < 120, (failed - first_step, wall_s)
    assert done.returncode != 0
    error = [line for line in done.stderr.splitlines() if line.startswith("geotrain: error:")]
    assert len(error) == 1 and "Traceback" not in done.stderr
    assert f"no reply within --comm-timeout {COMM_TIMEOUT_S} s; held up by rank 1 " in error[0]


@pytest.mark.timeout(600)
def test_each_rank_leaves_its_step_lines_and_why_it_ended(stuck_run):
    _, _, records = stuck_run
    for rank, ended_by in ((0, f"no reply within --comm-timeout {COMM_TIMEOUT_S} s"),
                           (1, "ended by the watchdog: abort: rank 0 ")):
        steps = [r["step"] for r in records[rank] if r["kind"] == "step"]
        failures = [r for r in records[rank] if r.get("event") == "failure"]
        # the lines are flushed every 2 s: the last ones were still buffered when the rank ended
        assert len(steps) >= 1 and steps == list(range(len(steps))), (rank, steps)
        assert len(failures) == 1 and failures[0]["step"] == len(steps), (rank, failures)
        assert ended_by in failures[0]["reason"] and records[rank][-1] == failures[0]
