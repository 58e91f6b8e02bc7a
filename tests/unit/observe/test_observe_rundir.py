"""Run directories without processes: default ones are made locked and marked, retention removes only finished
default ones (oldest first, by creation time), GEOTRAIN_KEEP_RUNS, and paths that cannot be run directories."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from geotrain.observe.rundir import (CREATED_MARKER, RUN_MARKER, RunDirError, check_run_dir, default_run_dir,
                                     keep_runs, sweep_old_runs)


def finished_run(root: Path, name: str, mtime_s: float) -> Path:
    """A default run directory whose launcher has ended: made, its lock released, its marker aged to `mtime_s`."""
    held = default_run_dir(name, root, now=0.0)  # every name starts 19700101-000000: only the marker tells age
    held.release()
    (held.path / RUN_MARKER).write_text("{}")
    os.utime(held.path / CREATED_MARKER, (mtime_s, mtime_s))
    return held.path


def test_default_run_dir_is_time_then_plan_never_reuses_a_name_and_is_locked_while_held(tmp_path):
    first = default_run_dir("my plan/x", tmp_path, now=0.0)
    assert first.path.name == "19700101-000000-my_plan_x" and [p.name for p in first.path.iterdir()] == [CREATED_MARKER]
    second = default_run_dir("my plan/x", tmp_path, now=0.0)
    assert second.path.name == "19700101-000000-my_plan_x-2"
    assert sweep_old_runs(tmp_path, keep=1) == [] and first.path.is_dir() and second.path.is_dir()  # both live
    first.release()
    assert sweep_old_runs(tmp_path, keep=1) == [first.path] and not first.path.exists() and second.path.is_dir()
    second.release()


def test_retention_removes_the_oldest_by_creation_time_not_by_name(tmp_path):
    old = finished_run(tmp_path, "zzz", 1000.0)  # sorts last by name, made first
    mid = finished_run(tmp_path, "aaa", 2000.0)
    new = finished_run(tmp_path, "mmm", 3000.0)
    assert sweep_old_runs(tmp_path, keep=2) == [old]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mid.name, new.name])


def test_retention_never_touches_live_runs_user_named_directories_symlinks_or_files(tmp_path):
    live = default_run_dir("live", tmp_path, now=0.0)  # the oldest, but its launcher still holds it
    os.utime(live.path / CREATED_MARKER, (10.0, 10.0))
    done = [finished_run(tmp_path, f"done{i}", 100.0 + i) for i in range(3)]
    named = tmp_path / "0-important"  # `--run-dir geotrain-runs/0-important`: a run.json, no marker
    named.mkdir()
    (named / RUN_MARKER).write_text("{}")
    (tmp_path / "link").symlink_to(done[2], target_is_directory=True)  # a symlink to a run: not a run of its own
    (tmp_path / "notes.txt").write_text("mine")
    removed = sweep_old_runs(tmp_path, keep=2)
    assert removed == [done[0], done[1]]  # counted: the live one, done2; the message says 2, not 3
    assert live.path.is_dir() and named.is_dir() and done[2].is_dir() and (tmp_path / "link").is_symlink()
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sweep_old_runs(tmp_path, keep=1) == [done[2]]  # the live one stays even beyond `keep`
    assert live.path.is_dir()
    live.release()


def test_a_lock_held_by_another_process_counts_and_dies_with_it(tmp_path):
    live = default_run_dir("other", tmp_path, now=0.0)
    marker = live.path / CREATED_MARKER
    live.release()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, sys
        handle = open({str(marker)!r}, "rb")
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        print("held", flush=True)
        sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert sweep_old_runs(tmp_path, keep=0) == [] and live.path.is_dir()
    finally:
        holder.kill()
        holder.wait()
    assert sweep_old_runs(tmp_path, keep=0) == [live.path] and not live.path.exists()


@pytest.mark.parametrize("value", ["²", "٣", "1.5", "-1", "0", "", "x", "1e3", "9" * 40])
def test_keep_runs_is_an_ascii_integer_of_at_least_one_in_one_line(monkeypatch, value):
    monkeypatch.setenv("GEOTRAIN_KEEP_RUNS", value)
    with pytest.raises(RunDirError, match=r"^GEOTRAIN_KEEP_RUNS: an integer >= 1 .*, got ") as caught:
        keep_runs()
    assert "\n" not in str(caught.value)


def test_keep_runs_reads_a_plain_integer_and_defaults_to_twenty(monkeypatch):
    monkeypatch.setenv("GEOTRAIN_KEEP_RUNS", " 3 ")
    assert keep_runs() == 3
    monkeypatch.delenv("GEOTRAIN_KEEP_RUNS")
    assert keep_runs() == 20


def test_a_root_that_is_a_file_or_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "geotrain-runs").write_text("")
    with pytest.raises(RunDirError, match=r"cannot make a run directory under .*geotrain-runs: is not a directory"):
        default_run_dir("p", tmp_path / "geotrain-runs")
    if Path("/proc/self").is_dir():  # unwritable even for root
        with pytest.raises(RunDirError, match=r"cannot make a run directory under /proc/geotrain-runs: "):
            default_run_dir("p", "/proc/geotrain-runs")


def test_an_empty_run_dir_is_refused_naming_the_flag():
    for empty in ("", "  "):
        with pytest.raises(RunDirError, match=r"^--run-dir: an empty path"):
            check_run_dir(empty)
