"""`--help` works for every command and sub-command (argparse %-formats help strings: a stray % crashes it)."""

import argparse

import pytest

from geotrain.cli.main import build_parser, main


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of the argparse tree, the root included: (), ("plan",), ("bench", "ddp"), ..."""
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths.extend(command_paths(child, (*prefix, name)))
    return paths


PATHS = command_paths(build_parser())


def test_the_tree_has_every_group_and_leaf():
    assert {("demo",), ("demo", "compress"), ("bench",), ("bench", "ddp"), ("cluster", "show"), ("plan",)} <= set(PATHS)
    assert len(PATHS) >= 15


@pytest.mark.parametrize("path", PATHS, ids=[" ".join(p) or "geotrain" for p in PATHS])
def test_help_exits_0_and_prints_usage(path, capsys):
    with pytest.raises(SystemExit) as caught:
        main([*path, "--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: geotrain" + "".join(f" {p}" for p in path))
