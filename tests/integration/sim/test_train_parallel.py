"""The simulator's process pool on the one supervisor: Ctrl-C ends `demo compress --jobs 2` at once
(it hung waiting for the running jobs), with one line and no pool process left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proctree import alive, cmdline, default_signals, descendants
from paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]
SRC = str(ROOT / "src")


def test_ctrl_c_stops_demo_compress_with_a_pool_at_once():
    args = ["demo", "compress", "--steps", "3000", "--workers", "2", "--jobs", "2", "--layers", "1", "--d-model", "32",
            "--json"]
    launcher = subprocess.Popen([sys.executable, "-m", "geotrain", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_signals,
                                env={**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"})
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 150
        while len([p for p in seen if "resource_tracker" not in cmdline(p) and alive(p)]) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, "the pool never started"
            seen |= descendants(launcher.pid)
            time.sleep(0.2)
        time.sleep(3.0)  # the jobs are running
        seen |= descendants(launcher.pid)
        stopped_at = time.monotonic()
        os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C in a terminal
        _, err = launcher.communicate(timeout=30)
        elapsed = time.monotonic() - stopped_at
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == 130 and elapsed < 20
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "geotrain: interrupted", err
    deadline = time.monotonic() + 15
    while any(alive(p) for p in seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in seen if alive(p)]
