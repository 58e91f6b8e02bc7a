"""Signals to one rank end with one line: SIGINT to one `train` worker, SIGKILL of one `bench ddp`
rank (its peers' lost-peer tracebacks used to be printed as the run's error)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proctree import cmdline, comm, default_signals, descendants
from runtime_2x2 import CLUSTER_YAML, PLAN
from paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]
SRC = str(ROOT / "src")


def _signal_one_rank(args: list[str], pick, sig: int) -> tuple[int, str]:
    """Run `geotrain ARGS`; once `pick(launcher_pid)` names a rank, wait 3 s, send it `sig`; return
    the launcher's exit code and stderr."""
    launcher = subprocess.Popen([sys.executable, "-m", "geotrain", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_signals,
                                env={**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 180
        while (victim := pick(launcher.pid)) is None:
            assert launcher.poll() is None and time.monotonic() < deadline, "no rank appeared"
            time.sleep(0.2)
        time.sleep(3.0)
        os.kill(victim, sig)
        _, err = launcher.communicate(timeout=150)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    return launcher.returncode, err


def test_sigint_to_one_train_worker_ends_the_run_with_one_line_per_process(tmp_path):
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    args = ["train", "--run-dir", "none", "--cluster", str(tmp_path / "cluster.yaml"), "--plan", str(tmp_path / "plan.json"),
            "--steps", "200", "--time-scale", "0.05", "--heartbeat-timeout", "5", "--json"]

    def rank1(launcher: int) -> int | None:
        family = descendants(launcher)
        names = {comm(pid): pid for pid in family}
        return names["geotrain-r1"] if {f"geotrain-r{r}" for r in range(4)} <= set(names) else None

    code, err = _signal_one_rank(args, rank1, signal.SIGINT)
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert "geotrain-rank-1: interrupted" in lines
    assert lines[-1].startswith("geotrain: error: rank 1 (stage 0, replica 1, device 2 west-0) exited with status 130")


def test_sigkill_of_one_bench_ddp_rank_is_one_line_naming_it():
    args = ["bench", "ddp", "--steps", "300", "--workers", "2", "--model", "small", "--batch", "4", "--row", "fp16",
            "--json"]

    def a_rank(launcher: int) -> int | None:
        family = descendants(launcher)
        servers = [pid for pid in family if "forkserver" in cmdline(pid) and pid in _children(launcher)]
        ranks = sorted(descendants(servers[0])) if servers else []
        return ranks[-1] if len(ranks) >= 2 else None

    code, err = _signal_one_rank(args, a_rank, signal.SIGKILL)
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("geotrain: error: worker rank ")
    assert "died without reporting (killed by SIGKILL)" in lines[0]


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.add(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found
