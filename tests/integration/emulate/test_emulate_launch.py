"""`geotrain emulate`'s launcher on the one supervisor: a killed rank is read while others run, the
others are stopped after the grace period, whole rank trees die with the launcher, signals end
with one line, and a timeout is always set."""

from __future__ import annotations

from paths import ROOT
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from geotrain.cli.main import main as cli_main
from geotrain.cluster import cluster_from_dict
from geotrain.emulate.launch import LaunchConfig, launch
from proctree import alive, default_signals

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]
SRC = str(ROOT / "src")
TWO = cluster_from_dict({"name": "t2", "regions": [{"name": "a", "devices": 2, "intra": {"gbps": 10, "ms": 1}}]})


@pytest.fixture(autouse=True)
def src_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_sigkill_of_rank_1_terms_rank_0_after_the_grace_period_and_names_rank_1(tmp_path):
    """The old loop (`any(p.poll() is None ...)`) stopped at live rank 0, never read rank 1's exit,
    and let rank 0 run its 60 s to the end."""
    script = write(tmp_path, "die.py", """
        import os, signal, time
        if os.environ["RANK"] == "1":
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """)
    started = time.monotonic()
    result = launch(TWO, [0, 1], LaunchConfig((str(script),), 0.0, grace_s=1.0, timeout_s=120))
    elapsed = time.monotonic() - started
    assert result.rank_codes == (128 + signal.SIGTERM, 128 + signal.SIGKILL)
    assert result.exit_code == 137 and not result.timed_out
    assert result.verdict.first_failed == 1 and result.verdict.stopped == frozenset({0})
    assert result.verdict.message == "rank 1 killed by SIGKILL; ranks [0] stopped after the 1 s grace period"
    assert elapsed < 45  # rank 0 would have slept 60 s


WITH_CHILD = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").write(f"{os.getpid()} {child.pid}")
time.sleep(300)
"""


def _start(tmp_path: Path, script: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "geotrain", "emulate", "--cluster", "seed-geo", "--devices", "0,9",
                             "--time-scale", "0", *extra, "--", str(script), str(tmp_path)],
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_signals)


def _rank_pids(tmp_path: Path, launcher: subprocess.Popen) -> list[int]:
    deadline = time.monotonic() + 120
    files = [tmp_path / r for r in "01"]
    while not all(f.exists() and f.read_text().count(" ") == 1 for f in files):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
        time.sleep(0.1)
    return [int(p) for f in files for p in f.read_text().split()]


def _gone(pids: list[int], limit_s: float = 15.0) -> bool:
    deadline = time.monotonic() + limit_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(p) for p in pids)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_launcher_takes_the_children_of_its_ranks_along(tmp_path, sig):
    script = write(tmp_path, "tree.py", WITH_CHILD)
    launcher = _start(tmp_path, script)
    try:
        pids = _rank_pids(tmp_path, launcher)  # rank 0, its child, rank 1, its child
        os.kill(launcher.pid, sig)
        launcher.wait(timeout=60)
        assert _gone(pids), f"alive after the launcher's {sig.name}: {[p for p in pids if alive(p)]}"
        if sig == signal.SIGTERM:
            assert launcher.returncode == 130
            assert "Traceback" not in launcher.stderr.read()
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_sigint_to_the_launchers_group_ends_with_one_line(tmp_path):
    script = write(tmp_path, "tree.py", WITH_CHILD)
    launcher = _start(tmp_path, script)
    try:
        pids = _rank_pids(tmp_path, launcher)
        os.killpg(launcher.pid, signal.SIGINT)  # as Ctrl-C in a terminal
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 130 and _gone(pids)
        assert "Traceback" not in err and err.strip().splitlines() == ["geotrain: interrupted"], err
    finally:
        if launcher.poll() is None:
            launcher.kill()


BARRIER = """
import os, signal, sys, time, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(1)
    {end}
for _ in range(600):
    dist.barrier()
    time.sleep(0.1)
"""


@pytest.mark.parametrize("end, code, how", [("os.kill(os.getpid(), signal.SIGKILL)", 137, "killed by SIGKILL"),
                                            ("os._exit(3)", 3, "exited with status 3")])
def test_a_rank_dying_mid_collective_ends_with_one_line_per_process(tmp_path, end, code, how):
    script = write(tmp_path, "barrier.py", BARRIER.format(end=end))
    result = subprocess.run([sys.executable, "-m", "geotrain", "emulate", "--cluster", "seed-geo", "--devices", "0,9",
                             "--time-scale", "0", "--", str(script)], capture_output=True, text=True, timeout=200)
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("geotrain emulate: 2 ranks on seed-geo, exit codes [") and f"(rank 1 {how}" in lines[-1]
    assert all(line.startswith("geotrain emulate") for line in lines), lines


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_timeout_must_be_a_finite_positive_number(value, capsys):
    with pytest.raises(SystemExit) as stop:
        cli_main(["emulate", "--cluster", "seed-geo", "--devices", "0,9", "--timeout", value, "--", "x.py"])
    assert stop.value.code == 2
    assert f"argument --timeout: must be a finite number > 0, got '{value}'" in capsys.readouterr().err


def test_emulate_has_a_default_timeout_stated_in_its_help(capsys):
    from geotrain.cli.emulate_cmd import DEFAULT_TIMEOUT_S

    assert DEFAULT_TIMEOUT_S == 900.0
    with pytest.raises(SystemExit):
        cli_main(["emulate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "after SEC wall seconds and exit 124" in help_text and "(default: 900.0)" in help_text
