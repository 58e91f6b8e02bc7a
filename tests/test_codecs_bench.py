"""`geotrain bench codecs` end to end: one JSON object with consistent rows (no timing assertions)."""

from __future__ import annotations

import json
import math

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
        assert row["k"] == int(0.01 * row["n"]) and row["same_set"] and row["energy_kept"] == 1.0
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
