"""One run directory per launcher (geotrain.procs.rundir): a run leaves the temp dir as it found it,
a SIGKILLed launcher's folders are removed (its guardian, or the next run's sweep by dead pid)."""

from __future__ import annotations

from paths import ROOT
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from geotrain.procs.rundir import PYMP_RECORD, RUNS_DIR, current_run_dir, run_directory, sweep_stale_run_dirs

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]
SRC = str(ROOT / "src")
SCRIPT = """
import os, sys, time, torch.distributed as dist
dist.init_process_group("gloo")
open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").write("up")
dist.barrier()
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def system_tmp():
    """A private, short system temp dir (a Unix socket path under it has at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="gt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _emulate(tmp_path: Path, system_tmp: Path, sleep_s: float) -> subprocess.Popen:
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent(SCRIPT))
    (tmp_path / "marks").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "geotrain", "emulate", "--cluster", "seed-geo", "--devices", "0,9",
                             "--time-scale", "0", "--", str(script), str(tmp_path / "marks"), str(sleep_s)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SRC, "TMPDIR": str(system_tmp)})


def test_a_run_leaves_the_temp_dir_as_it_found_it(tmp_path, system_tmp):
    launcher = _emulate(tmp_path, system_tmp, 0.0)
    _, err = launcher.communicate(timeout=200)
    assert launcher.returncode == 0, err
    assert sorted(p.name for p in system_tmp.iterdir()) == []


def test_a_sigkilled_launcher_leaves_no_folder(tmp_path, system_tmp):
    launcher = _emulate(tmp_path, system_tmp, 120.0)
    deadline = time.monotonic() + 150
    while not all((tmp_path / "marks" / r).exists() for r in "01"):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
        time.sleep(0.1)
    runs = system_tmp / RUNS_DIR
    assert [p.name.split("-")[0] for p in runs.iterdir()] == [str(launcher.pid)]
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 15
    while list(runs.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(runs.iterdir()) == []  # removed by the guardian
    assert sorted(p.name for p in system_tmp.iterdir()) == [RUNS_DIR]


def test_a_run_starting_while_another_run_s_exit_removes_the_empty_root_still_gets_its_directory(tmp_path,
                                                                                                   monkeypatch):
    import geotrain.procs.rundir as rundir

    swept = []

    def exit_of_another_run(root):  # between this run's mkdir of the root and its mkdtemp inside it (seen in CI)
        swept.append(root)
        if len(swept) == 1:
            root.rmdir()
        return []

    monkeypatch.setattr(rundir, "sweep_stale_run_dirs", exit_of_another_run)
    with run_directory(tmp_path) as path:
        assert path.is_dir() and path.parent == tmp_path / RUNS_DIR and len(swept) == 2


def test_stale_run_dirs_of_dead_pids_are_swept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale, live = tmp_path / f"{dead.pid}-abcd", tmp_path / f"{os.getppid()}-abcd"
    other = tmp_path / "\u00b2-abcd"  # a digit to str.isdigit, not to int(): not a run directory
    for path in (stale, live, other):
        (path / "pymp-x").mkdir(parents=True)
    assert sweep_stale_run_dirs(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()


@pytest.mark.slow
def test_a_train_run_leaves_no_torchinductor_folder_in_the_temp_dir(tmp_path, system_tmp):
    """It left `torchinductor_<user>` in the system temp dir after every run (its fork server imports
    torch._dynamo whatever the plan: one rank and one step are a whole run)."""
    import json

    from runtime_2x2 import CLUSTER_YAML

    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp_path / "plan.json").write_text(json.dumps({"method": "manual", "stages": 1, "replicas": 1,
                                                    "assignment": [[0]]}))
    done = subprocess.run([sys.executable, "-m", "geotrain", "train", "--cluster", str(tmp_path / "cluster.yaml"),
                           "--plan", str(tmp_path / "plan.json"), "--steps", "1", "--time-scale", "0", "--json",
                           "--run-dir", "none"],
                          capture_output=True, text=True, timeout=200,
                          env={**os.environ, "PYTHONPATH": SRC, "TMPDIR": str(system_tmp)})
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in system_tmp.iterdir()) == []


def test_run_directory_redirects_temp_files_unless_the_socket_path_would_be_too_long(tmp_path, system_tmp):
    before = tempfile.gettempdir()
    with run_directory(system_tmp) as path:
        assert tempfile.gettempdir() == os.environ["TMPDIR"] == str(path) and current_run_dir() == path
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path / "torchinductor")
    assert tempfile.gettempdir() == before and current_run_dir() is None
    deep = tmp_path / ("x" * 80)
    deep.mkdir()
    with run_directory(deep) as path:  # the fork server's socket would not fit under it
        assert tempfile.gettempdir() == before and current_run_dir() == path
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path / "torchinductor")


def test_a_sigkilled_launcher_with_a_long_temp_path_leaves_no_pymp_folder(tmp_path, system_tmp):
    """With a run directory too long for the fork server's socket, multiprocessing's pymp-* folder lies
    beside geotrain-runs: the guardian removes it with the run directory, and so does the next sweep."""
    deep = system_tmp / ("t" * 40)  # short enough for the socket, too long for a run directory under it
    deep.mkdir()
    launcher = _emulate(tmp_path, deep, 120.0)
    deadline = time.monotonic() + 150
    while not all((tmp_path / "marks" / r).exists() for r in "01"):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
        time.sleep(0.1)
    assert len([p for p in deep.iterdir() if p.name.startswith("pymp-")]) == 1
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 15

    def cleared() -> bool:  # the guardian removes the pymp folder first, then the run directory (rundir.run_paths)
        return sorted(p.name for p in deep.iterdir()) == [RUNS_DIR] and not any((deep / RUNS_DIR).iterdir())

    while not cleared() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(p.name for p in deep.iterdir()) == [RUNS_DIR]
    assert list((deep / RUNS_DIR).iterdir()) == []


def test_the_sweep_removes_a_dead_runs_recorded_pymp_folder_and_nothing_else(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / "runs" / f"{dead.pid}-abcd"
    stale.mkdir(parents=True)
    pymp, other = tmp_path / "pymp-stale", tmp_path / "pymp-someone-elses"
    pymp.mkdir(), other.mkdir()
    (stale / PYMP_RECORD).write_text(str(pymp))
    assert sweep_stale_run_dirs(tmp_path / "runs") == [stale]
    assert not stale.exists() and not pymp.exists() and other.exists()
    not_pymp = tmp_path / "runs" / f"{dead.pid}-efgh"
    not_pymp.mkdir()
    (not_pymp / PYMP_RECORD).write_text(str(tmp_path))  # a record naming anything but a pymp-* folder is ignored
    sweep_stale_run_dirs(tmp_path / "runs")
    assert tmp_path.exists() and other.exists() and not not_pymp.exists()
