"""`geotrain train`'s default run directory from the command line: two runs in one directory with
GEOTRAIN_KEEP_RUNS=1 both stay whole (retention skips a live run), and the paths and settings that cannot give
a run directory are one line each (an empty --run-dir, GEOTRAIN_KEEP_RUNS=², a file named geotrain-runs, a
working directory where nothing can be made)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import ROOT
from runtime_2x2 import write_job_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
GEOTRAIN = [sys.executable, "-m", "geotrain"]
FIRST_STEPS = 24
SLOW = ("--chaos", "slow:site=0,factor=5")
"""The first run: 24 steps with replica 0 computing 5x slower (`--chaos slow`: without link emulation its ranks sleep
4x the compute they measured, and replica 1 waits for them in the all-reduce). It still trains after the second
run's start-up on a loaded machine, mostly asleep, so the second run's start-up has the cores: the sleep grows with
the measured compute, so with the load (150 plain steps kept 4 ranks computing on the cores the second run needed;
30 plain steps once ended before the second run's launcher started under a suite's load)."""
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "GEOTRAIN_KEEP_RUNS": "1"}


def train(files: dict[str, str], steps: int, cwd: Path, *flags: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*GEOTRAIN, "train", "--cluster", files["cluster"], "--plan", files["plan"], "--steps",
                             str(steps), "--time-scale", "0", "--json", *flags], cwd=cwd, env=env or ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def whole(run_dir: Path, steps: int) -> bool:
    """run.json, trace.json and every rank's step lines and end record are there."""
    lines = [json.loads(line) for path in sorted((run_dir / "metrics").glob("rank-*.jsonl"))
             for line in path.read_text().splitlines()]
    done = {(r["rank"], r["step"]) for r in lines if r["kind"] == "step"}
    ends = {r["rank"] for r in lines if r.get("event") == "end"}
    return ((run_dir / "run.json").is_file() and (run_dir / "trace.json").is_file()
            and done == {(rank, s) for rank in range(4) for s in range(steps)} and ends == set(range(4)))


def test_two_runs_started_in_one_directory_with_keep_one_both_stay_whole(tmp_path):
    files = write_job_files(tmp_path)
    first = train(files, FIRST_STEPS, tmp_path, *SLOW)
    deadline = time.monotonic() + 120
    # the first one's directory is made and locked (its ranks still start, then train: all of that is the second
    # one's slack; waiting for its first metrics line left too little once under a suite's load)
    while not list(tmp_path.glob("geotrain-runs/*/run.json")):
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()[-2000:]
        time.sleep(0.2)
    second = train(files, 2, tmp_path)
    out_2, err_2 = second.communicate(timeout=240)
    out_1, err_1 = first.communicate(timeout=240)
    assert first.returncode == 0 and second.returncode == 0, err_1[-2000:] + err_2[-2000:]
    dir_1, dir_2 = (tmp_path / json.loads(out)["run_dir"] for out in (out_1, out_2))
    assert dir_1 != dir_2 and "removed" not in err_2
    # the second one's sweep (before its run.json) happened while the first one still had steps to write
    started_2 = json.loads((dir_2 / "run.json").read_text())["started_unix_s"]
    last_1 = max(json.loads(line)["t_wall"] for line in (dir_1 / "metrics" / "rank-0.jsonl").read_text().splitlines())
    assert started_2 < last_1, (started_2, last_1)
    assert whole(dir_1, FIRST_STEPS) and whole(dir_2, 2)


def test_paths_and_settings_that_give_no_run_directory_are_one_line(tmp_path):
    files = write_job_files(tmp_path)
    for flags, env, line in [
        (("--run-dir", ""), ENV, "geotrain: error: --run-dir: an empty path (an unset variable?): name a directory, "
                                 "or 'none' for no run directory"),
        ((), {**ENV, "GEOTRAIN_KEEP_RUNS": "²"}, "geotrain: error: GEOTRAIN_KEEP_RUNS: an integer >= 1 (how many "
                                                 "default run directories to keep), got '²'")]:
        done = train(files, 1, tmp_path, *flags, env=env)
        out, err = done.communicate(timeout=120)
        assert done.returncode == 2 and err.strip().splitlines() == [line] and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml", "plan.json"]  # nothing written here
    (tmp_path / "geotrain-runs").write_text("mine")  # a file where the runs' folder goes: a note, no run directory
    done = train(files, 1, tmp_path)
    out, err = done.communicate(timeout=240)
    assert done.returncode == 0 and "run_dir" not in json.loads(out), err[-2000:]
    assert (f"geotrain: note: no run directory: cannot make a run directory under {tmp_path}/geotrain-runs: is not "
            "a directory (name one with --run-dir DIR, or --run-dir none)") in err.splitlines()
    assert (tmp_path / "geotrain-runs").read_text() == "mine" and "Traceback" not in err
