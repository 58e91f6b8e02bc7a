"""Nothing geotrain starts outlives it: SIGKILL each launcher (train, bench ddp, bench runtime,
demo compress with worker processes) once its children run; 15 s later none of its descendants
(workers, fork server, pool processes, manager, resource tracker) may be alive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from proctree import alive, cmdline, comm, descendants

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]

from runtime_2x2 import CLUSTER_YAML, PLAN
SURVIVAL_LIMIT_S = 15.0


def _kill_launcher_and_check(args: list[str], ready: Callable[[set[int]], bool], tmp_path: Path) -> None:
    """Start `geotrain ARGS` in its own session; once `ready(descendants)`, SIGKILL it alone and
    require every descendant ever seen to be gone within SURVIVAL_LIMIT_S."""
    log = open(tmp_path / "stderr.txt", "w")
    launcher = subprocess.Popen([sys.executable, "-m", "geotrain", *args], stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while True:
            family = descendants(launcher.pid)
            seen |= family
            if ready(family):
                break
            assert launcher.poll() is None, (tmp_path / "stderr.txt").read_text()
            assert time.monotonic() < deadline, f"children never ready: {[(p, comm(p)) for p in family]}"
            time.sleep(0.2)
        time.sleep(0.5)
        seen |= descendants(launcher.pid)
        os.kill(launcher.pid, signal.SIGKILL)  # the launcher only: as a caller's timeout does
        launcher.wait(timeout=10)
        deadline = time.monotonic() + SURVIVAL_LIMIT_S
        while any(alive(pid) for pid in seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = [(pid, comm(pid), cmdline(pid)[:120]) for pid in seen if alive(pid)]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid in seen:  # clean up after a failure: never leave the machine busy
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        log.close()
    assert not survivors, f"alive {SURVIVAL_LIMIT_S:g} s after the launcher was killed: {survivors}"


def _python_children_at_least(count: int) -> Callable[[set[int]], bool]:
    """Ready when `count` descendants run Python code of ours (not the resource tracker)."""
    def ready(family: set[int]) -> bool:
        workers = [pid for pid in family if "resource_tracker" not in cmdline(pid)]
        return len(workers) >= count
    return ready


WATCHER = """
import sys, time
from geotrain.procs import die_with_parent
die_with_parent(int(sys.argv[1]))
print("armed", flush=True)
time.sleep(120)
"""


def _wait_dead(process: subprocess.Popen, limit_s: float) -> bool:
    try:
        process.wait(timeout=limit_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_a_child_dies_when_the_launcher_it_watches_dies_though_its_parent_lives():
    """The fork-server case: the watched launcher is not the parent (this test process is)."""
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    child = subprocess.Popen([sys.executable, "-c", WATCHER, str(launcher.pid)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "armed"
        assert child.poll() is None
        launcher.kill()  # not reaped yet: a zombie launcher counts as dead
        assert _wait_dead(child, SURVIVAL_LIMIT_S), "the child outlived the launcher it watches"
        assert child.returncode == -signal.SIGKILL
    finally:
        for process in (launcher, child):
            process.kill()
            process.wait()


def test_a_child_started_after_its_launcher_died_kills_itself_at_once():
    launcher = subprocess.Popen([sys.executable, "-c", "pass"])
    launcher.wait()
    child = subprocess.Popen([sys.executable, "-c", WATCHER, str(launcher.pid)], stdout=subprocess.PIPE, text=True)
    try:
        assert _wait_dead(child, SURVIVAL_LIMIT_S)
        assert child.returncode == -signal.SIGKILL and child.stdout.read() == ""
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_train_launcher_killed_leaves_no_worker(tmp_path):
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    args = ["train", "--run-dir", "none", "--cluster", str(tmp_path / "cluster.yaml"), "--plan", str(tmp_path / "plan.json"),
            "--steps", "200", "--time-scale", "0.05", "--heartbeat-timeout", "60", "--json"]
    # A 60 s heartbeat timeout: the workers' own watchdogs cannot be what ends them within 15 s.
    ready = lambda family: {comm(pid) for pid in family} >= {f"geotrain-r{r}" for r in range(4)}  # noqa: E731
    _kill_launcher_and_check(args, ready, tmp_path)


@pytest.mark.slow
def test_bench_ddp_killed_leaves_no_rank_forkserver_or_tracker(tmp_path):
    args = ["bench", "ddp", "--steps", "300", "--workers", "2", "--model", "small", "--batch", "4",
            "--row", "fp16", "--json"]
    _kill_launcher_and_check(args, _python_children_at_least(3), tmp_path)  # fork server + 2 ranks


@pytest.mark.slow
def test_bench_runtime_killed_leaves_no_worker(tmp_path):
    args = ["bench", "runtime", "--devices-per-region", "2", "--stages", "2", "--replicas", "2",
            "--steps", "200", "--time-scale", "0.05", "--json"]
    ready = lambda family: {comm(pid) for pid in family} >= {f"geotrain-r{r}" for r in range(4)}  # noqa: E731
    _kill_launcher_and_check(args, ready, tmp_path)


@pytest.mark.slow
def test_demo_compress_with_worker_processes_killed_leaves_no_pool_process(tmp_path):
    args = ["demo", "compress", "--steps", "300", "--workers", "2", "--jobs", "2", "--layers", "1",
            "--d-model", "32", "--json"]
    _kill_launcher_and_check(args, _python_children_at_least(3), tmp_path)  # manager + 2 pool processes
