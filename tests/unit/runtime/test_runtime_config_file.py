"""The sectioned run config as a file: `geotrain train --print-config` writes TOML that `--config` reads
back to the same settings, flags override the file, the plan's codecs sit below both, and a bad key or
value is one line naming `section.key`."""

from __future__ import annotations

import json
import pickle
import tomllib
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.cli.main import build_parser, main
from geotrain.cli.train_cmd import config_from_args, forwarded_arguments
from geotrain.cluster import load_cluster
from geotrain.codecs import CodecSpec
from geotrain.runtime import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.config import build_sections, section_types
from geotrain.runtime.config_file import check_settings, config_toml, merge_settings, read_config_file

from runtime_2x2 import CLUSTER_YAML, PLAN

SECTIONS = ["run", "model", "data", "schedule", "comm", "optim", "checkpoint", "reliability", "emulation"]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp_path / "plan.json").write_text(json.dumps({**PLAN, "codecs": {"dp": ["none", "sign"], "pp": ["fp16"]}}))
    return tmp_path


def _printed(capsys, *argv: str) -> str:
    assert main(["train", "--print-config", *argv]) == 0
    return capsys.readouterr().out


def test_print_config_alone_writes_every_default_one_table_per_section(capsys):
    text = _printed(capsys)
    doc = tomllib.loads(text)
    assert list(doc) == SECTIONS
    assert doc["run"] == {"steps": 20, "seed": 0, "device": "cpu", "precision": "fp32", "threads": 1}
    assert doc["comm"]["dp_codec"] == "none" and doc["comm"]["error_feedback"] is True
    assert doc["reliability"] == {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 10.0, "comm_timeout_s": 120.0,
                                  "elastic": False, "min_replicas": 1, "max_restarts": 3, "netlab": False}
    assert "# stop_after is unset" in text and "stop_after" not in doc["run"]
    assert build_sections(check_settings(doc, "test")) == build_sections({})


def test_printed_file_reads_back_to_the_same_file_and_flags_override_it(capsys, tmp_path):
    text = _printed(capsys, "--steps", "7", "--dp-codec", "topk:fraction=0.01", "--no-error-feedback",
                    "--lr", "1e-05", "--stop-after", "3")
    path = tmp_path / "run.toml"
    path.write_text(text)
    assert _printed(capsys, "--config", str(path)) == text
    again = tomllib.loads(_printed(capsys, "--config", str(path), "--steps", "9"))
    assert again["run"] == {**tomllib.loads(text)["run"], "steps": 9}
    assert again["comm"]["dp_codec"] == "topk:fraction=0.01" and again["optim"]["lr"] == 1e-05


def test_the_plans_codecs_are_below_the_file_and_the_file_below_the_flags(files, capsys):
    base = ["--cluster", str(files / "cluster.yaml"), "--plan", str(files / "plan.json")]
    printed = tomllib.loads(_printed(capsys, *base))
    assert printed["comm"]["dp_codecs"] == ["none", "sign"] and printed["comm"]["pp_codecs"] == ["fp16"]
    (files / "run.toml").write_text(_printed(capsys, *base))  # the plan's choice, written out, reads back
    config = config_from_args(build_parser().parse_args(["train", *base, "--config", str(files / "run.toml")]))
    assert [str(s) for s in config.comm.dp_codecs] == ["none", "sign"]
    (files / "fp16.toml").write_text('[comm]\ndp_codec = "fp16"\n[run]\nsteps = 5\n')
    args = build_parser().parse_args(["train", *base, "--config", str(files / "fp16.toml"), "--steps", "6"])
    config = config_from_args(args)
    assert config.comm.dp_codecs == () and config.comm.stage_dp_codec(1) == CodecSpec("fp16")  # file over plan
    assert config.run.steps == 6 and config.comm.pp_codecs == (CodecSpec("fp16"),)  # flag over file
    words = forwarded_arguments(args)
    assert "--config" not in words and words[words.index("--steps") + 1] == "6"
    assert words[words.index("--dp-codec") + 1] == "fp16"


@pytest.mark.parametrize("text, message", [
    ("[comm]\nfoo = 1\n", "unknown key comm.foo"),
    ("[network]\nx = 1\n", "unknown section 'network'"),
    ("steps = 3\n", "unknown section 'steps'"),
    ("[run]\nsteps = 0\n", "run.steps must be an integer >= 1, got 0"),
    ("[run]\nsteps = \"many\"\n", "run.steps must be an integer >= 1, got 'many'"),
    ("[optim]\nlr = -1\n", "optim.lr must be a finite number > 0, got -1"),
    ("[checkpoint]\nresume = \"yes\"\n", "checkpoint.resume must be true or false, got 'yes'"),
    ("[comm]\npp_codec = \"topk\"\n", "comm.pp_codec: pipeline codec must be one of none, fp16, bf16"),
    ("[comm]\ndp_codec = \"topk:k=3\"\n", "comm.dp_codec: gradient codec 'topk:k=3'"),
    ("[emulation]\ntime_scale = inf\n", "emulation.time_scale must be a finite number >= 0, got inf"),
    ("[run\n", "not TOML"),
])
def test_bad_files_give_one_line_naming_section_and_key(tmp_path, capsys, text, message):
    (tmp_path / "run.toml").write_text(text)
    assert main(["train", "--print-config", "--config", str(tmp_path / "run.toml")]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("geotrain: error: ")
    assert message in lines[0], lines[0]


def test_training_without_cluster_or_plan_is_one_line(capsys):
    assert main(["train", "--steps", "2"]) == 2
    assert capsys.readouterr().err.strip() == ("geotrain: error: train needs --cluster and --plan (only "
                                               "--print-config runs without them)")


def test_no_flag_default_is_set_on_the_parser_and_every_section_has_its_help():
    args = build_parser().parse_args(["train"])
    for section in section_types():
        assert section.__doc__
        for f in fields(section):
            assert not hasattr(args, f.name), f.name  # given-or-absent: the field's default is the only default
            assert f.metadata["help"]


def test_the_config_pickles_with_its_sections(files):
    config = RuntimeConfig.of(load_cluster(str(files / "cluster.yaml")), np.array(PLAN["assignment"]), steps=3,
                              dp_codec="topk:fraction=0.1")
    again = pickle.loads(pickle.dumps(config))
    assert again.sections() == config.sections() and again.identity() == config.identity()
    assert again.comm.dp_codec == CodecSpec("topk", (("fraction", 0.1),))
    with pytest.raises(RuntimeConfigError, match="unknown setting 'step'"):
        RuntimeConfig.of(config.cluster, config.assignment, step=3)


SPECS = st.sampled_from(["none", "fp16", "sign", "int8-block:block_size=64", "topk:fraction=0.01",
                         "randk:fraction=0.5,allow_nonfinite=true", "powersgd:rank=2"])
FINITE = st.floats(min_value=1e-12, max_value=1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.integers(1, 10**9), lr=FINITE, seed=st.integers(0, 2**62), dp_codec=SPECS,
       pp_codec=st.sampled_from(["none", "fp16", "bf16"]), time_scale=st.just(0.0) | FINITE,
       stop_after=st.none() | st.integers(1, 100), checkpoint_dir=st.none() | st.text(min_size=1, max_size=30),
       error_feedback=st.booleans(), schedule=st.sampled_from(["gpipe", "1f1b"]))
def test_any_settings_survive_the_toml_round_trip(tmp_path, steps, lr, seed, dp_codec, pp_codec, time_scale,
                                                  stop_after, checkpoint_dir, error_feedback, schedule):
    given_settings = {"run": {"steps": steps, "seed": seed, "stop_after": stop_after},
                      "optim": {"lr": lr}, "emulation": {"time_scale": time_scale},
                      "comm": {"dp_codec": dp_codec, "pp_codec": pp_codec, "error_feedback": error_feedback},
                      "schedule": {"schedule": schedule}, "checkpoint": {"checkpoint_dir": checkpoint_dir}}
    sections = build_sections(given_settings)
    path = tmp_path / "round.toml"
    path.write_text(config_toml(sections), encoding="utf-8")
    assert build_sections(read_config_file(path)) == sections


def test_a_given_codec_replaces_the_lists_of_the_layers_below():
    plan = {"comm": {"dp_codecs": ("none", "sign"), "pp_codecs": ("fp16",)}}
    merged = merge_settings(plan, {"comm": {"dp_codec": "fp16"}}, {"run": {"steps": 2}})
    assert merged == {"comm": {"pp_codecs": ("fp16",), "dp_codec": "fp16"}, "run": {"steps": 2}}


def test_print_config_names_the_flag_of_a_key_whose_flag_is_not_its_name():
    """`model_name` is set by `--model`: the TOML says so (a user reading it would try --model-name)."""
    from geotrain.runtime.config import build_sections
    from geotrain.runtime.config_file import config_toml

    text = config_toml(build_sections({}))
    assert "(flag --model)\nmodel_name = " in text
    assert "(flag --no-error-feedback)\nerror_feedback = true" in text
    assert "(flag --steps)" not in text  # --steps is steps' own name
