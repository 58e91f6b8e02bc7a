"""Help texts show defaults as a user would type them: a preset name, never a path of this machine."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from geotrain.cli.main import build_parser
from paths import ROOT


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from _parsers(child)


def test_no_help_text_names_the_install_or_the_python_prefix():
    machine = [str(ROOT), sys.prefix, str(ROOT / "src")]
    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 20  # every command and bench
    for parser in parsers:
        text = parser.format_help()
        assert not [path for path in machine if path in text], f"{parser.prog}: {text}"


def test_bench_wan_and_chaos_default_to_the_cluster_name():
    helps = {p.prog: p.format_help() for p in _parsers(build_parser())}
    for prog in ("geotrain bench wan", "geotrain bench chaos"):
        assert "(default: wan-4x1)" in " ".join(helps[prog].split()), helps[prog]
