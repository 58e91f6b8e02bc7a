"""The command line takes options as written: no argparse abbreviations (`--over` once meant
`--overwrite` and deleted another run's checkpoints), on every parser of the tree."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from geotrain.cli.main import COMMAND_MODULES, build_parser, main

from runtime_2x2 import CLUSTER_YAML, PLAN


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found.extend(_parsers(child))
    return found


def test_every_parser_of_the_tree_refuses_abbreviations():
    parsers = _parsers(build_parser())
    assert len(parsers) >= 20
    assert [p.prog for p in parsers if p.allow_abbrev] == []


@pytest.mark.parametrize("words, option", [
    (["train", "--checkpoint-dir", "{ck}", "--over"], "--over"),
    (["train", "--checkpoint-dir", "{ck}", "--res"], "--res"),
    (["plan", "--cluster", "seed-geo", "--time", "5"], "--time 5"),
    (["data", "prepare", "{cluster}", "--out", "{ck}/x.bin", "--val", "0.5"], "--val 0.5"),
])
def test_abbreviated_options_are_refused_and_nothing_is_touched(words, option, tmp_path, capsys):
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    ck = tmp_path / "ck"
    (ck / "step-000002").mkdir(parents=True)
    (ck / "latest").write_text("step-000002\n")
    if words[0] == "train":
        words = [*words, "--cluster", str(tmp_path / "cluster.yaml"), "--plan", str(tmp_path / "plan.json")]
    words = [w.format(ck=ck, cluster=tmp_path / "cluster.yaml") for w in words]
    with pytest.raises(SystemExit) as caught:
        main(words)
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"geotrain: error: unrecognized arguments: {option}"
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step-000002"]


@pytest.mark.parametrize("command", [["cluster", "show", "seed-geo"], ["plan", "--help"], ["data", "--help"]])
def test_a_command_imports_its_own_module_and_not_torch(command):
    code = ("import sys\nfrom geotrain.cli.main import main\n"
            f"try:\n    main({command!r})\nexcept SystemExit:\n    pass\n"
            "print('MODULES', 'torch' in sys.modules, 'geotrain.cli.train_cmd' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "MODULES False False"


def test_help_lists_every_command_in_order():
    listed = [action.choices for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)]
    assert list(listed[0]) == list(COMMAND_MODULES)
    only = [action.choices for action in build_parser(["plan", "--x"])._actions
            if isinstance(action, argparse._SubParsersAction)]
    assert list(only[0]) == ["plan"]
