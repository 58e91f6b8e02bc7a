"""`geotrain demo compress` (the seed's demo 2): table specs, observations from numbers, CLI JSON end to end."""

import json
import math

import pytest

from geotrain.cli.main import main
from geotrain.data import world_tokens
from geotrain.demos.compress import (
    COMPRESS_TABLES,
    CompressDemo,
    CompressDemoConfig,
    RunRow,
    RunSpec,
    TableSpec,
    compress_observations,
    run_compress_demo,
)
from geotrain.models import GPTConfig

TINY = GPTConfig(n_layer=1, d_model=32, n_head=2)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_tables_are_the_seeds_runs():
    assert [t.key for t in COMPRESS_TABLES] == ["adamw", "sgd", "onebit"]
    adamw, sgd, onebit = COMPRESS_TABLES
    assert [r.key for r in onebit.runs] == ["none", "onebit", "sign", "adamw-floor", "adamw-floor-frozen"]
    assert onebit.optimizer == "adamw"
    assert [r.key for r in adamw.runs] == ["none", "fp16", "int8", "int8-block", "topk", "topk-ef", "sign", "sign-ef"]
    assert (adamw.optimizer, adamw.clip_norm, sgd.optimizer, sgd.clip_norm) == ("adamw", 1.0, "sgd", None)
    assert [r.key for r in sgd.runs] == ["none", "topk", "topk-ef"]
    assert all(r.codec_params == {"fraction": 0.01} for t in COMPRESS_TABLES for r in t.runs if r.codec == "topk")


def test_an_extra_table_is_one_more_spec():
    extra = TableSpec("mini", "a one-run table", "sgd", None, (RunSpec("fp16", "fp16", "fp16"),))
    config = CompressDemoConfig(steps=3, workers=2, model=TINY, tables=(extra,))
    demo = run_compress_demo(config, world_tokens(0))
    assert [(r.table, r.key, r.bytes_per_value) for r in demo.rows] == [("mini", "fp16", 2.0)]
    assert demo.to_json()["tables"][0]["rows"][0]["key"] == "fp16"
    assert compress_observations(demo) == []  # its rows are not the seed's


def _demo(bpc: dict[tuple[str, str], float]) -> CompressDemo:
    rows = tuple(RunRow(table, key, key, key, key.endswith("-ef"), 1.0, 0.25, value, value, 0, 1.0, None)
                 for (table, key), value in bpc.items())
    return CompressDemo(CompressDemoConfig(), 1000, rows, 1.0)


SEED_NUMBERS = {("adamw", "none"): 1.5065, ("adamw", "fp16"): 1.5070, ("adamw", "int8"): 1.6384,
                ("adamw", "int8-block"): 1.52, ("adamw", "topk"): 2.82, ("adamw", "topk-ef"): 2.77,
                ("adamw", "sign"): 1.74, ("adamw", "sign-ef"): 2.69, ("sgd", "none"): 1.9,
                ("sgd", "topk"): 3.11, ("sgd", "topk-ef"): 2.79}


def test_observations_hold_on_the_seeds_numbers():
    observations = compress_observations(_demo(SEED_NUMBERS))
    assert [o.key for o in observations] == ["fp16", "int8", "topk", "ef-topk", "sign"]
    assert all(o.holds for o in observations)
    texts = " ".join(o.text for o in observations)
    assert "1.5070" in texts and "+0.3200" in texts and "1.7400" in texts


@pytest.mark.parametrize(("change", "key"), [
    ({("adamw", "fp16"): 1.55}, "fp16"),
    ({("adamw", "int8-block"): 1.63}, "int8"),
    ({("adamw", "int8"): 1.50}, "int8"),
    ({("adamw", "topk"): 1.55}, "topk"),
    ({("sgd", "topk-ef"): 3.30}, "ef-topk"),
    ({("adamw", "sign-ef"): 1.70}, "sign"),
])
def test_each_observation_fails_when_its_numbers_say_otherwise(change, key):
    observations = {o.key: o for o in compress_observations(_demo({**SEED_NUMBERS, **change}))}
    assert not observations[key].holds
    assert all(o.holds for k, o in observations.items() if k != key)


@pytest.mark.slow
def test_cli_json_end_to_end(tmp_path, capsys):
    plot = tmp_path / "bpc.png"
    assert main(["demo", "compress", "--steps", "2", "--workers", "2", "--layers", "1", "--d-model", "32",
                 "--jobs", "1", "--json", "--plot", str(plot)]) == 0
    report = json.loads(capsys.readouterr().out)  # exactly one JSON object on stdout
    assert (report["demo"], report["steps"], report["workers"]) == ("compress", 2, 2)
    assert (report["model"]["n_layer"], report["model"]["d_model"]) == (1, 32)
    n = report["params"]
    rows = {(t["key"], r["key"]): r for t in report["tables"] for r in t["rows"]}
    assert len(rows) == 16
    assert rows["onebit", "none"] == {**rows["adamw", "none"], "table": "onebit", "label": "AdamW, fp32 gradients"}
    assert rows["onebit", "onebit"]["bytes_per_value"] < 4.0
    assert rows["adamw", "none"]["bytes_per_value"] == 4.0
    assert rows["adamw", "fp16"]["bytes_per_value"] == 2.0
    assert rows["adamw", "int8"]["bytes_per_value"] == pytest.approx(1 + 4 / n)
    assert rows["adamw", "topk"]["bytes_per_value"] == pytest.approx(8 * int(0.01 * n) / n)
    assert rows["adamw", "sign"]["bytes_per_value"] == pytest.approx(math.ceil(n / 8) / n + 4 / n)
    assert rows["sgd", "topk-ef"]["traffic_vs_fp32"] == pytest.approx(rows["sgd", "topk-ef"]["bytes_per_value"] / 4)
    assert all(3.0 < r["val_bpc"] < 6.0 for r in rows.values())  # 2 steps: barely trained
    assert [o["key"] for o in report["observations"]] == ["fp16", "int8", "topk", "ef-topk", "sign", "onebit",
                                                         "onebit-floor"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_bad_options(capsys):
    assert main(["demo", "compress", "--workers", "5", "--steps", "1"]) == 2
    assert "divisible" in capsys.readouterr().err
    assert main(["demo", "compress", "--d-model", "30", "--steps", "1"]) == 2
    assert "divisible by n_head" in capsys.readouterr().err
