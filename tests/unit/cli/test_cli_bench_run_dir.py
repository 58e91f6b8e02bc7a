"""Every bench's --run-dir: 'none' means no run directory, as `train --run-dir none` (no directory named none)."""

from __future__ import annotations

import pytest

from geotrain.cli.main import build_parser

BENCHES = ("chaos", "hetero", "runtime", "wan")


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_run_dir_none_means_no_run_directory(bench):
    words = ["bench", bench, "--run-dir", "none"]
    assert build_parser(words).parse_args(words).run_dir is None


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_run_dir_names_a_directory_otherwise(bench):
    words = ["bench", bench, "--run-dir", "runs/none-of-these"]
    assert build_parser(words).parse_args(words).run_dir == "runs/none-of-these"
    assert build_parser(["bench", bench]).parse_args(["bench", bench]).run_dir is None
