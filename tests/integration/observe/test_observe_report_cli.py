"""`geotrain report` from the command line (in process) on damaged and killed runs, and its output checks:
an unwritable or unknown --plot path and a --tensorboard folder that cannot be written are refused before
any work, exit 2, nothing on stdout (with --json too)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from geotrain.cli.main import main


def record(kind: str, rank: int, step: int, **fields) -> str:
    base = {"kind": kind, "step": step, "rank": rank, "site": ("east", "west")[rank % 2], "t_wall": 100.0 + step}
    if kind == "step":
        base.update(stage=0, replica=rank, step_s=1.0, compute_s=0.5, comm_s=0.2, wait_s=0.3, loss=3.0)
    return json.dumps({**base, **fields}, separators=(",", ":")) + "\n"


@pytest.fixture
def damaged_run(tmp_path: Path) -> Path:
    """Rank 0 ends normally with one line not UTF-8 and one negative step time; rank 1 fails (the watchdog's
    failure event) after a line torn mid-file; rank 2 is a directory; run.json lists ranks 0-2."""
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"plan": "p", "cluster": "c", "ranks": [{"rank": r} for r in range(3)]}))
    (run / "metrics" / "rank-0.jsonl").write_bytes(
        (record("event", 0, 0, event="start") + record("step", 0, 0) + record("step", 0, 1)).encode()
        + b"\xff\xfe\n" + record("step", 0, 2, step_s=-41.9).encode()
        + record("event", 0, -1, event="end", steps=2, observer_s=0.001, bytes_written=10).encode())
    (run / "metrics" / "rank-1.jsonl").write_text(
        record("event", 1, 0, event="start") + record("step", 1, 0) + record("step", 1, 1)[:30] + record("step", 1, 1)
        + record("event", 1, 2, event="failure", reason="watchdog: no step for 30 s"))
    (run / "metrics" / "rank-2.jsonl").mkdir()
    return run


def test_a_damaged_killed_run_is_reported_with_its_skipped_lines_and_marked_incomplete(damaged_run, capsys):
    assert main(["report", str(damaged_run)]) == 0
    out = capsys.readouterr().out
    assert ("incomplete: 2 ranks did not end normally (rank 1: failure: watchdog: no step for 30 s; rank 2: no "
            "readable metrics line)") in out
    assert ("skipped 3 unreadable lines: metrics/rank-0.jsonl line 4: not UTF-8; metrics/rank-0.jsonl line 5: "
            "'step_s' is not seconds >= 0; metrics/rank-1.jsonl line 3: not JSON; metrics/rank-2.jsonl: not a "
            "regular file, skipped") in out
    assert "Traceback" not in out and "-4194%" not in out
    assert main(["report", str(damaged_run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["incomplete"] == {"ranks": {"1": "failure: watchdog: no step for 30 s", "2": "no readable metrics line"}}
    assert doc["skipped_lines"] == 3 and doc["steps"] == 4 and doc["ranks"] == 2
    assert [r["steps"] for r in doc["split"]["ranks"]] == [1, 1]  # steps after the first: rank 0's 1, rank 1's 1


@pytest.mark.parametrize("plot, why", [
    ("/proc/x.png", "argument --plot: '/proc/x.png': not writable (No such file or directory)"),
    ("/sys/x.png", "argument --plot: '/sys/x.png': not writable ("),
    ("report.xyz", "argument --plot: 'report.xyz': a plot file ends in one of "),
], ids=["proc", "sys", "extension"])
def test_an_unusable_plot_path_is_refused_before_any_work(damaged_run, capsys, plot, why, monkeypatch):
    if not Path(plot).parent.is_dir():
        pytest.skip(f"no {Path(plot).parent} here")
    monkeypatch.chdir(damaged_run.parent)
    for json_flag in ([], ["--json"]):
        with pytest.raises(SystemExit) as stopped:
            main(["report", str(damaged_run), "--tensorboard", "--plot", plot, *json_flag])
        captured = capsys.readouterr()
        assert stopped.value.code == 2 and captured.out == "" and why in captured.err.splitlines()[-1]
    assert not (damaged_run / "tensorboard").exists() and not Path(plot).exists()


def test_a_tensorboard_folder_that_cannot_be_written_is_refused_before_the_plot(damaged_run, capsys):
    pytest.importorskip("tensorboard")
    (damaged_run / "tensorboard").write_text("")  # a file where the folder goes
    plot = damaged_run.parent / "p.png"
    for json_flag in ([], ["--json"]):
        assert main(["report", str(damaged_run), "--tensorboard", "--plot", str(plot), *json_flag]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.splitlines() == [
            f"geotrain: error: {damaged_run}/tensorboard: cannot write TensorBoard files there: is not a directory"]
    assert not plot.exists()
    if os.geteuid() != 0:  # a read-only run directory (root writes through the mode bits)
        (damaged_run / "tensorboard").unlink()
        damaged_run.chmod(0o555)
        try:
            assert main(["report", str(damaged_run), "--tensorboard"]) == 2
            assert "cannot write TensorBoard files there: Permission denied" in capsys.readouterr().err
        finally:
            damaged_run.chmod(0o755)
