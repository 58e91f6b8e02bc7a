"""Kill tests for labs (root, network namespaces): `netlab up` SIGTERMed or SIGKILLed mid-build and
`netlab run` SIGKILLed while its ranks' children run leave no namespace and no process; with the
guardians killed too, `netlab down --all` finds and removes both kinds of leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from geotrain.cli.main import main
from geotrain.netlab.names import NETNS_DIR
from geotrain.netlab.processes import pids_in_namespace
from lab_marks import NEEDS_LAB
from proctree import alive, cmdline, descendants
from paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), NEEDS_LAB]

SRC = str(ROOT / "src")
ENV = {**os.environ, "PYTHONPATH": SRC}
CLEANUP_LIMIT_S = 60.0  # the guardian starts `netlab down --all`: a Python start-up under load


def owned_by(pid: int) -> list[str]:
    try:
        return sorted(name for name in os.listdir(NETNS_DIR) if name.startswith(f"gt{pid}-"))
    except FileNotFoundError:
        return []


def wait_until(condition, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def start_up(*extra: str) -> subprocess.Popen:
    """`netlab up` of every seed-geo device (12 namespaces and more), returned at its first namespace."""
    owner = subprocess.Popen([sys.executable, "-m", "geotrain", "netlab", "up", "--cluster", "seed-geo", "--hold", "60",
                              *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    assert wait_until(lambda: owned_by(owner.pid) or owner.poll() is not None, 120), "no namespace appeared"
    assert owner.poll() is None, owner.stderr.read()
    return owner


def kill_guardians(owner: subprocess.Popen) -> None:
    for pid in descendants(owner.pid):
        if "guardian.py" in cmdline(pid):
            os.kill(pid, signal.SIGKILL)


def test_netlab_up_sigtermed_mid_build_leaves_no_namespace():
    owner = start_up()
    owner.send_signal(signal.SIGTERM)
    assert owner.wait(timeout=120) == 128 + signal.SIGTERM
    assert owned_by(owner.pid) == []


def test_netlab_up_sigkilled_mid_build_leaves_no_namespace():
    owner = start_up()
    owner.kill()
    owner.wait(timeout=30)
    assert wait_until(lambda: owned_by(owner.pid) == [], CLEANUP_LIMIT_S), owned_by(owner.pid)


RANK_WITH_CHILD = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").write(f"{os.getpid()} {child.pid}")
    time.sleep(600)
""")


def start_run(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_WITH_CHILD)
    owner = subprocess.Popen([sys.executable, "-m", "geotrain", "netlab", "run", "--cluster", "seed-geo",
                              "--devices", "0,8", "--", str(script), str(tmp_path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    files = [tmp_path / r for r in "01"]
    ready = lambda: all(f.exists() and f.read_text().count(" ") == 1 for f in files)  # noqa: E731
    assert wait_until(lambda: ready() or owner.poll() is not None, 120) and owner.poll() is None, owner.stderr.read()
    return owner, [int(p) for f in files for p in f.read_text().split()]


def test_netlab_run_sigkilled_leaves_no_rank_child_and_no_namespace(tmp_path):
    owner, pids = start_run(tmp_path)
    owner.kill()
    owner.wait(timeout=30)
    assert wait_until(lambda: not any(alive(p) for p in pids), 15), [p for p in pids if alive(p)]
    assert wait_until(lambda: owned_by(owner.pid) == [], CLEANUP_LIMIT_S), owned_by(owner.pid)


def test_down_all_removes_a_half_built_lab_and_processes_left_in_namespaces(tmp_path, capsys):
    # One after the other: a lab that starts sweeps the leftovers of dead owners itself.
    half = start_up()
    kill_guardians(half)
    half.kill()
    half.wait(timeout=30)
    time.sleep(2)
    assert owned_by(half.pid)  # nobody cleaned up...
    assert main(["netlab", "down", "--all"]) == 0  # ...until this
    assert owned_by(half.pid) == []
    run, pids = start_run(tmp_path)
    kill_guardians(run)
    run.kill()
    run.wait(timeout=30)
    time.sleep(2)
    children = [pid for name in owned_by(run.pid) for pid in pids_in_namespace(name)]
    assert set(children) & set(pids[1::2]), "the ranks' children should be left in the namespaces"
    assert main(["netlab", "down", "--all"]) == 0
    assert owned_by(run.pid) == []
    assert wait_until(lambda: not any(alive(p) for p in pids), 10)
