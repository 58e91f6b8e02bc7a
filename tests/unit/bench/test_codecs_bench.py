"""`geotrain bench codecs` end to end: one JSON object with consistent rows (no timing assertions)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from geotrain.cli.main import main
from geotrain.codecs import CODECS, get_codec


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_bench_codecs_json_reports_every_codec_beside_memcpy(capsys):
    threads_before = torch.get_num_threads()
    code, out, _ = run_cli(capsys, "bench", "codecs", "--sizes", "3e4", "7e4", "--repeats", "1", "--json")
    assert code == 0
    bench = json.loads(out)
    assert bench["threads"] == 1 and torch.get_num_threads() == threads_before  # restored afterwards
    labels = [row["label"] for row in bench["rows"] if row["n"] == 30_000]
    assert labels == list(CODECS) + ["topk-sort"]
    for row in bench["rows"]:
        codec = get_codec(row["codec"], **row["params"])
        assert row["bytes_per_value"] == codec.wire_nbytes((row["n"] // 1000, 1000)) / row["n"]
        assert row["encode_s"] > 0 and row["decode_s"] > 0 and row["memcpy_s"] > 0
        assert math.isclose(row["gbps"], 4 * row["n"] / (row["encode_s"] + row["decode_s"]) / 1e9)
        assert math.isclose(row["ratio_to_memcpy"], row["gbps"] / row["memcpy_gbps"])
    by_label = {row["label"]: row for row in bench["rows"] if row["n"] == 70_000}
    assert by_label["none"]["relative_error"] == 0.0
    assert by_label["fp16"]["relative_error"] < 1e-3 < by_label["int8"]["relative_error"]
    assert by_label["int8-block"]["relative_error"] < by_label["int8"]["relative_error"]
    assert by_label["topk"]["relative_error"] == by_label["topk-sort"]["relative_error"]  # same k values kept
    assert [row["n"] for row in bench["topk"]] == [30_000, 70_000]
    for row in bench["topk"]:
        assert row["k"] == int(0.01 * row["n"]) and row["same_set"]
        # the same k squares summed in float64 in two orders: each sum within (k - 1) u of the exact one
        assert abs(row["energy_kept"] - 1.0) <= 2 * row["k"] * 2.0 ** -53
    assert bench["targets"] == []  # targets are checked at 1e7 values only


def test_bench_codecs_table_and_codec_filter(capsys):
    code, out, _ = run_cli(capsys, "bench", "codecs", "--sizes", "2e4", "--repeats", "1", "--codec", "sign",
                           "--codec", "topk-sort")
    assert code == 0
    assert "sign" in out and "topk-sort" in out and "int8-block" not in out
    assert "x memcpy" in out and "speed-up" in out


def test_bench_codecs_rejects_unknown_rows(capsys):
    code, _, err = run_cli(capsys, "bench", "codecs", "--codec", "fp8")
    assert code == 2 and "unknown --codec 'fp8'" in err


@pytest.mark.parametrize("argv,message", [
    (["--fraction", "0"], r"--fraction \(top-k share\) must be a number in \(0, 1\], got 0.0"),
    (["--fraction", "1.5"], r"--fraction .*got 1.5"),
    (["--fraction", "nan"], r"--fraction .*got nan"),
    (["--sizes", "1.5"], r"--sizes must be integers in 1..2147483647 \(1e6 is fine\), got '1.5'"),
    (["--sizes", "1e4", "0"], r"--sizes must be integers .*got '0'"),
    (["--sizes", "-3"], r"--sizes .*got '-3'"),
    (["--sizes", "inf"], r"--sizes .*got 'inf'"),
    (["--sizes", "1e12"], r"--sizes .*got '1e12'"),
    (["--sizes", "ten"], r"--sizes must be integers such as 1000000 or 1e6, got 'ten'"),
    (["--repeats", "0"], r"--repeats must be an integer >= 1, got 0"),
    (["--seed", "-1"], r"--seed must be an integer >= 0, got -1"),
])
def test_bench_codecs_refuses_bad_options_instead_of_changing_them(capsys, argv, message):
    code, out, err = run_cli(capsys, "bench", "codecs", "--repeats", "1", *argv)
    assert code == 2 and out == ""
    assert re.search(message, err.strip().splitlines()[-1])


def test_bench_config_checks_its_fields_and_keeps_integral_sizes():
    from geotrain.bench.codecs import CodecBenchConfig, CodecBenchError, parse_size

    assert parse_size("1e6") == 1_000_000 and parse_size("30000") == 30_000
    with pytest.raises(CodecBenchError, match=r"--sizes must be an integer in 1..2147483647, got 1.5"):
        CodecBenchConfig(sizes=(1.5,))
    with pytest.raises(CodecBenchError, match=r"--fraction"):
        CodecBenchConfig(topk_fraction=0)
