"""`geotrain train` end to end, as a user runs it: the CLI with --json, a worker killed mid-run, torchrun.

The two runs that are not about the launch (--json; a user's model file) run one after the other in one process
(tests/one_interpreter.py: the second launch skips the first's seconds of imports and fork server start-up)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from one_interpreter import OneInterpreter
from proctree import alive, comm, descendants
from runtime_2x2 import CLUSTER_YAML, PLAN

from geotrain.cli.train_cmd import SUMMARY_JSON_KEYS, TRAIN_JSON_KEYS

GEOTRAIN = [sys.executable, "-m", "geotrain"]


@pytest.fixture
def job_files(tmp_path: Path) -> tuple[str, str]:
    cluster, plan = tmp_path / "cluster.yaml", tmp_path / "plan.json"
    cluster.write_text(CLUSTER_YAML)
    plan.write_text(json.dumps(PLAN))
    return str(cluster), str(plan)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """The 2x2 plan's --json run ("json") and its run of a user's model file on a text file ("user-model")."""
    from user_models import USER_GPT

    folder = tmp_path_factory.mktemp("runs")
    (folder / "cluster.yaml").write_text(CLUSTER_YAML)
    (folder / "plan.json").write_text(json.dumps(PLAN))
    (folder / "my_model.py").write_text(USER_GPT)
    (folder / "corpus.txt").write_text("the cat sat on the mat. the dog ran under a tree.\n" * 200)
    job = ["--run-dir", "none", "--cluster", str(folder / "cluster.yaml"), "--plan", str(folder / "plan.json")]
    commands = {"json": ["train", *job, "--steps", "3", "--time-scale", "0.2", "--dp-codec", "fp16", "--json"],
                "user-model": ["train", *job, "--steps", "2", "--time-scale", "0", "--model",
                               f"{folder / 'my_model.py'}:build", "--data", str(folder / "corpus.txt"), "--seq-len",
                               "16", "--eval-every", "1", "--eval-windows", "8", "--schedule", "1f1b"]}
    return dict(zip(commands, OneInterpreter(list(commands.values()), folder, "runs").results(), strict=True))


@pytest.mark.timeout(240)
def test_train_cli_runs_a_2x2_plan_and_prints_one_json_object(runs):
    done = runs["json"]
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # exactly one JSON object
    assert result["plan"] == "manual" and result["assignment"] == PLAN["assignment"]
    assert len(result["losses"]) == 3 and result["losses"][-1] < result["losses"][0]
    summary = result["summary"]
    assert summary["replicas_in_sync"] is True
    assert set(TRAIN_JSON_KEYS) <= set(result) and set(SUMMARY_JSON_KEYS) <= set(summary)  # as --elastic's
    assert result["elastic"] is False and summary["final_loss"] == result["losses"][-1]
    assert summary["comm_predicted_s"] == pytest.approx(result["prediction"]["total"])
    assert summary["comm_measured_s"] >= 0.95 * summary["comm_predicted_s"] > 0  # emulation never runs fast
    assert summary["error_pct"] == pytest.approx(
        100 * (summary["comm_measured_s"] - summary["comm_predicted_s"]) / summary["comm_predicted_s"])
    assert result["bytes"]["dp_per_stage"][0] == 2 * sum([44 * 128, 96 * 128, 2 * (128 * 384 + 384 + 128 * 128 + 128 +
                                                           4 * 128 + 128 * 512 + 512 + 512 * 128 + 128)])
    assert [row["step"] for row in result["iterations"]] == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_killed_worker_ends_the_run_in_bounded_time_naming_it_with_no_orphans(job_files, tmp_path):
    cluster, plan = job_files
    checkpoints = tmp_path / "ckpt"
    launcher = subprocess.Popen([*GEOTRAIN, "train", "--run-dir", "none", "--cluster", cluster, "--plan", plan, "--steps", "200",
                                 "--time-scale", "0.05", "--heartbeat-timeout", "3", "--checkpoint-dir", str(checkpoints),
                                 "--checkpoint-every", "1", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 150
        while not (checkpoints / "latest").exists():  # mid-run: at least one step done everywhere
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 150 s"
            time.sleep(0.2)
        family = descendants(launcher.pid)
        victim = next(pid for pid in family if comm(pid) == "geotrain-r1")
        assert {comm(pid) for pid in family} >= {f"geotrain-r{r}" for r in range(4)}
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        stdout, stderr = launcher.communicate(timeout=120)
        elapsed = time.monotonic() - killed_at
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 2
    assert stdout == ""
    assert elapsed < 30, f"took {elapsed:.1f} s to notice a dead worker"
    error = stderr.strip().splitlines()[-1]
    assert error.startswith("geotrain: error: rank 1 (stage 0, replica 1, device 2 west-0) killed by SIGKILL after ")
    # killed by a signal, the worker is the culprit at once: its peers are stopped without waiting out their
    # 3 s heartbeat timeout to report it lost
    assert "workers reported" not in error and "no heartbeat" not in error
    time.sleep(1.0)
    leftovers = [pid for pid in family if alive(pid)]
    assert not leftovers, f"processes left behind: {[(pid, comm(pid)) for pid in leftovers]}"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_train_runs_unchanged_under_torchrun(job_files):
    cluster, plan = job_files
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           "-m", "geotrain", "train", "--run-dir", "none", "--cluster", cluster, "--plan", plan, "--steps", "2",
                           "--time-scale", "0.05", "--json"], capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # rank 0 reports; the other ranks print nothing
    result = json.loads(lines[0])
    assert len(result["losses"]) == 2 and result["summary"]["replicas_in_sync"] is True


@pytest.mark.timeout(240)
def test_train_cli_trains_a_user_file_model_on_a_text_file_with_a_validation_table(runs):
    done = runs["user-model"]
    assert done.returncode == 0, done.stderr
    table = done.stdout[done.stdout.index("validation (held-out loss, nats)"):done.stdout.index("summary")]
    rows = [line.split("│")[1:3] for line in table.splitlines() if line.startswith("│")]
    assert [int(step) for step, _ in rows] == [1, 2]
    assert float(rows[1][1]) < float(rows[0][1])  # the held-out loss falls
