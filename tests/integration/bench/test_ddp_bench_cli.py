"""`geotrain bench ddp` end to end: one JSON object, rows side by side, bytes as declared."""

import json

import pytest

from geotrain.cli.main import main


@pytest.mark.slow
def test_bench_ddp_json_rows(capsys):
    code = main(["bench", "ddp", "--steps", "2", "--workers", "2", "--batch", "4", "--model", "small",
                 "--row", "fp16", "--row", "sign", "--row", "OneBitAdam", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    rows = {row["label"]: row for row in report["rows"]}
    assert list(rows)[0].startswith("AdamW, DDP fp32") and rows[list(rows)[0]]["traffic_vs_fp32"] == 1.0
    assert rows["torch fp16_compress_hook"]["traffic_vs_fp32"] == 0.5
    assert rows["geotrain fp16"]["wire_bytes_per_step"] == rows["torch fp16_compress_hook"]["wire_bytes_per_step"]
    assert rows["geotrain sign"]["traffic_vs_fp32"] < 0.04  # 1 bit + a scale per tensor, all-gathered by 2 ranks
    assert all(row["declared_bytes_match"] in (True, None) for row in rows.values())
    assert all(row["val_bpc"] > 0 for row in rows.values())
    assert any(label.startswith("OneBitAdam") for label in rows)


def test_bench_ddp_rejects_bad_options(capsys):
    assert main(["bench", "ddp", "--batch", "30", "--workers", "4"]) == 2
    assert "divisible" in capsys.readouterr().err
