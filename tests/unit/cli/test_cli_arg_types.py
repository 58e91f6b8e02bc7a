"""Numbers and output paths on the command line are checked before any work starts, one way for every
command (cli/arg_types.py): seeds in 0..2^32-1, counts >= 1, bandwidths in the range cluster files
allow, output files in an existing writable directory; bench wan's target, lr and batch finite."""

from __future__ import annotations

import time

import pytest

from geotrain.bench.wan import DEFAULT_ROWS
from geotrain.cli.main import main


@pytest.mark.parametrize("words, message", [
    (["plan", "--cluster", "seed-geo", "--seed", "-1"],
     "geotrain plan: error: argument --seed: must be an integer in 0..4294967295, got -1"),
    (["bench", "seeds", "--seeds", "0"],
     "geotrain bench seeds: error: argument --seeds: must be an integer in 1..1000000, got 0"),
    (["bench", "plan", "--seed", "x"],
     "geotrain bench plan: error: argument --seed: must be an integer in 0..4294967295, got 'x'"),
    (["emulate", "--cluster", "seed-geo", "--devices", "0,1", "--nic-gbps", "1e-300", "--", "s.py"],
     "geotrain emulate: error: argument --nic-gbps: must be a bandwidth in 1e-06..1e+06 Gbit/s (or inf: unlimited), "
     "got '1e-300'"),
    (["emulate", "--cluster", "seed-geo", "--devices", "0,1", "--nic-gbps", "nan", "--", "s.py"],
     "geotrain emulate: error: argument --nic-gbps: must be a bandwidth in 1e-06..1e+06 Gbit/s (or inf: unlimited), "
     "got 'nan'"),
    (["demo", "schedule", "--plot", "missing/dir/x.png"],
     "geotrain demo schedule: error: argument --plot: 'missing/dir/x.png': directory 'missing/dir' "
     "does not exist"),
    (["emulate", "--cluster", "seed-geo", "--devices", "0,1", "--report", "missing/r.json", "--", "s.py"],
     "geotrain emulate: error: argument --report: 'missing/r.json': directory 'missing' does not exist"),
    (["plan", "--cluster", "seed-geo", "--out", "."],
     "geotrain plan: error: argument --out: must be a file path, got the directory '.'"),
])
def test_bad_numbers_and_output_paths_are_usage_errors_before_any_work(words, message, tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    with pytest.raises(SystemExit) as caught:
        main(words)
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == message
    assert time.monotonic() - started < 5  # refused before the computation


@pytest.mark.parametrize("option, value, message", [
    ("--target", "nan", "--target must be a finite validation loss > 0 (nats per character), got nan"),
    ("--target", "-1", "--target must be a finite validation loss > 0 (nats per character), got -1.0"),
    ("--lr", "inf", "--lr must be a finite number > 0, got inf"),
    ("--global-batch", "0", "--global-batch, microbatches and validation windows must be >= 1, got 0, 4, 128"),
    ("--rows", "-1", f"--rows: comma-separated row numbers in 0..{len(DEFAULT_ROWS) - 1}, got '-1'"),
])
def test_bench_wan_refuses_numbers_it_could_never_finish_with(option, value, message, capsys):
    started = time.monotonic()
    assert main(["bench", "wan", option, value]) == 2
    assert capsys.readouterr().err == f"geotrain: error: {message}\n"
    assert time.monotonic() - started < 30


def test_an_output_file_made_by_another_process_while_checked_is_accepted(tmp_path, monkeypatch):
    """Two ranks of a torchrun job check the same `--out` at once: the one whose trial file finds the other's is
    not refused (a loaded CI host saw rank 1 exit with 'not writable (File exists)')."""
    import os

    from geotrain.cli.arg_types import output_file

    target = tmp_path / "probed.yaml"
    real_open = os.open

    def other_rank_first(path, flags, mode=0o777):
        real_open(path, os.O_WRONLY | os.O_CREAT, 0o644)  # the other rank's trial file, made first
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", other_rank_first)
    assert output_file(str(target)) == str(target)
    assert target.exists()  # the other rank's file is left to it


def test_a_link_to_a_file_not_yet_written_is_checked_as_its_target(tmp_path):
    """`--plot latest.png` where latest.png links to a file the run will write: its target's directory is what
    must be writable (the write follows the link); a link into a missing directory, or a loop, is refused."""
    import argparse

    from geotrain.cli.arg_types import output_file, plot_file

    (tmp_path / "plots").mkdir()
    (tmp_path / "latest.png").symlink_to(tmp_path / "plots" / "run-7.png")
    assert plot_file(str(tmp_path / "latest.png")) == str(tmp_path / "latest.png")
    assert not (tmp_path / "plots" / "run-7.png").exists()
    (tmp_path / "lost.png").symlink_to(tmp_path / "gone" / "run-7.png")
    with pytest.raises(argparse.ArgumentTypeError, match="gone.*does not exist"):
        output_file(str(tmp_path / "lost.png"))
    (tmp_path / "loop.png").symlink_to(tmp_path / "loop.png")
    with pytest.raises(argparse.ArgumentTypeError, match="a symbolic link that loops"):
        output_file(str(tmp_path / "loop.png"))
