"""`geotrain train` refuses impossible options with one line (exit 2) before launching anything, and
ignores env:// variables left over in the environment when torchrun did not start it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from geotrain.cli.main import main
from geotrain.cli.train_cmd import stray_torchrun_variables, under_torchrun

from runtime_2x2 import CLUSTER_YAML, PLAN


@pytest.fixture
def base(tmp_path: Path) -> list[str]:
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    return ["train", "--run-dir", "none", "--cluster", str(tmp_path / "cluster.yaml"), "--plan", str(tmp_path / "plan.json"),
            "--time-scale", "0", "--steps", "1", "--json"]


@pytest.mark.parametrize("options, message", [
    (["--microbatches", "0"], "^--microbatches must be an integer >= 1, got 0"),
    (["--microbatches", "-2"], "^--microbatches must be an integer >= 1, got -2"),
    (["--steps", "-5"], "^--steps must be an integer >= 1, got -5"),
    (["--steps", "0"], "^--steps must be an integer >= 1, got 0"),
    (["--batch-size", "0"], "^--batch-size must be an integer >= 1, got 0"),
    (["--batch-size", "6"], r"^--batch-size must be a positive multiple of microbatches \(4\), got 6"),
    (["--threads", "0"], "^--threads must be an integer >= 1, got 0"),
    (["--seed", "-1"], "^--seed must be an integer >= 0, got -1"),
    (["--data-seed", "-1"], "^--data-seed must be an integer >= 0, got -1"),
    (["--checkpoint-every", "-1"], "^--checkpoint-every must be an integer >= 0, got -1"),
    (["--checkpoint-dir", "CK", "--keep-checkpoints", "0"], "^--keep-checkpoints must be an integer >= 1, got 0"),
    (["--keep-checkpoints", "-3"], "^--keep-checkpoints must be an integer >= 1, got -3"),
    (["--stop-after", "0"], "^--stop-after must be an integer >= 1, got 0"),
    (["--lr", "nan"], "^--lr must be a finite number > 0, got nan"),
    (["--lr", "inf"], "^--lr must be a finite number > 0, got inf"),
    (["--lr", "0"], "^--lr must be a finite number > 0, got 0.0"),
    (["--time-scale", "inf"], "^--time-scale must be a finite number >= 0, got inf"),
    (["--time-scale", "-1"], "^--time-scale must be a finite number >= 0, got -1.0"),
    (["--heartbeat-timeout", "inf"], "^--heartbeat-timeout must be a finite number > 0, got inf"),
    (["--heartbeat-timeout", "0.5"], "^--heartbeat-timeout must be more than twice heartbeat_interval_s"),
    (["--comm-timeout", "inf"], "^--comm-timeout must be a finite number > 0, got inf"),
    (["--comm-timeout", "nan"], "^--comm-timeout must be a finite number > 0, got nan"),
    (["--comm-timeout", "-1"], "^--comm-timeout must be a finite number > 0, got -1.0"),
    (["--comm-timeout", "0"], "^--comm-timeout must be a finite number > 0, got 0.0"),
    (["--comm-timeout", "0.001"], "^--comm-timeout must be at least 1 s"),
    (["--resume"], "resume needs a checkpoint directory"),
    (["--overwrite"], "overwrite needs a checkpoint directory"),
    (["--pp-codec", "topk"], "pipeline codec must be one of none, fp16, bf16, int8, .*powersgd, delta, got 'topk': "
                             "torch.*payload layout depends on the data"),
    (["--schedule", "interleaved-1f1b", "--microbatches", "3", "--batch-size", "6"],
     "microbatches must be a multiple of the 2 stages with schedule 'interleaved-1f1b', got 3"),
    (["--schedule", "1f1b", "--virtual-stages", "2"], "^--virtual-stages must be 1 with schedule '1f1b', got 2"),
    (["--val-fraction", "1.5"], r"^--val-fraction must be in \[0, 1\), got 1.5"),
    (["--eval-every", "-1"], "^--eval-every must be an integer >= 0, got -1"),
    (["--seq-len", "0"], "^--seq-len must be an integer >= 1, got 0"),
    (["--data", "/no/such/corpus.txt"], "^--data '/no/such/corpus.txt': no such file or directory"),
    (["--model", "gpt7"], "^--model 'gpt7': not a preset"),
    (["--dp-hierarchical", "--dp-codec", "powersgd"], "--dp-hierarchical takes a codec of geotrain.codecs"),
    (["--sync-every", "0"], "^--sync-every must be an integer >= 1, got 0$"),
    (["--sync-every", "2", "--outer-lr", "0"], "^--outer-lr must be a finite number > 0, got 0.0$"),
    (["--sync-every", "2", "--outer-momentum", "1"], r"^--outer-momentum must be a finite number in \[0, 1\), got 1.0$"),
    (["--emulate-gpu-speed"], "^--emulate-gpu-speed scales the emulated compute, but --time-scale 0.0 runs without "
                              "emulation"),
])
def test_impossible_train_options_give_one_line_and_exit_2(base, capsys, options, message):
    assert main([*base, *options]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("geotrain: error: "), captured.err
    assert re.search(message, lines[0].removeprefix("geotrain: error: ")), lines[0]


def test_a_value_from_a_config_file_is_named_by_its_key_and_a_flag_by_the_flag(base, tmp_path, capsys):
    (tmp_path / "run.toml").write_text("[run]\nsteps = 0\n\n[schedule]\nmicrobatches = 0\n")
    assert main([*base, "--config", str(tmp_path / "run.toml")]) == 2  # base gives --steps 1: microbatches fails
    assert capsys.readouterr().err == "geotrain: error: schedule.microbatches must be an integer >= 1, got 0\n"
    assert main([*base, "--config", str(tmp_path / "run.toml"), "--microbatches", "-1"]) == 2  # the flag wins
    assert capsys.readouterr().err == "geotrain: error: --microbatches must be an integer >= 1, got -1\n"


@pytest.mark.parametrize("text, message", [
    ("", "data '{path}': file is empty"),
    ("a short text.\n", "data '{path}': its train split holds 13 tokens (bytes), fewer than one sequence of "
                         "seq_len + 1 = 97: give more text or a shorter --seq-len"),
])
def test_an_empty_or_too_short_data_file_is_one_line_before_any_process_starts(base, tmp_path, capsys, text,
                                                                                  message):
    from proctree import descendants

    path = tmp_path / "corpus.txt"
    path.write_text(text)
    before = descendants(os.getpid())
    assert main([*base, "--data", str(path)]) == 2
    assert capsys.readouterr().err == f"geotrain: error: {message.format(path=path)}\n"
    assert descendants(os.getpid()) <= before  # no worker, no fork server was started


def test_env_variables_count_as_torchrun_only_with_its_marker(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    assert not under_torchrun() and stray_torchrun_variables() == []
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_PORT", "1")
    assert not under_torchrun() and stray_torchrun_variables() == ["RANK", "MASTER_PORT"]
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert not under_torchrun()
    assert stray_torchrun_variables() == ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run")
    assert under_torchrun() and stray_torchrun_variables() == []


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_stray_torchrun_variables_are_ignored_with_a_note_and_the_run_completes(base):
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"}
    env.pop("TORCHELASTIC_RUN_ID", None)
    # Before: this waited --comm-timeout (120 s) for a store on port 9, then printed a traceback.
    done = subprocess.run([sys.executable, "-m", "geotrain", *base, "--comm-timeout", "60"], env=env,
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    assert ("geotrain: note: ignoring RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment: this process "
            "was not started by torchrun (TORCHELASTIC_RUN_ID is unset), so it launches its own workers") in done.stderr
    result = json.loads(done.stdout)
    assert len(result["losses"]) == 1 and result["summary"]["replicas_in_sync"] is True
