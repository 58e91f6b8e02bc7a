"""`--help` states one default per flag: argparse's ArgumentDefaultsHelpFormatter appended "(default: X)" to
helps that already said their default ("... (default: the plan's choice) (default: none)") and to
required flags ("(required) (default: None)")."""

import argparse
import re

import pytest

from geotrain.cli.help_format import DefaultsHelpFormatter, help_with_default
from geotrain.cli.main import build_parser

DEFAULT_WORD = re.compile(r"\(default\b|\bdefault:", re.IGNORECASE)


def parsers(parser: argparse.ArgumentParser, prefix: str = "geotrain") -> list[tuple[str, argparse.ArgumentParser]]:
    """Every (command path, parser) of the argparse tree."""
    found = [(prefix, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.extend(parsers(child, f"{prefix} {name}"))
    return found


def shown_helps(parser: argparse.ArgumentParser) -> list[tuple[argparse.Action, str]]:
    """Each option's help as `--help` prints it (defaults appended, %-templates expanded)."""
    formatter = parser._get_formatter()
    return [(action, formatter._expand_help(action)) for action in parser._actions
            if action.help and action.help is not argparse.SUPPRESS and action.option_strings]


PARSERS = parsers(build_parser())


@pytest.mark.parametrize("path,parser", PARSERS, ids=[p for p, _ in PARSERS])
def test_no_flag_shows_two_defaults_and_required_flags_show_none(path, parser):
    for action, text in shown_helps(parser):
        flag = action.option_strings[-1]
        assert len(DEFAULT_WORD.findall(text)) <= 1, f"{path} {flag}: {text}"
        assert "(default: None)" not in text, f"{path} {flag}: {text}"
        if action.required:
            assert not DEFAULT_WORD.search(text), f"{path} {flag} is required: {text}"


def test_the_train_flags_of_the_issue_show_one_default_each():
    train = dict(PARSERS)["geotrain train"]
    helps = {action.option_strings[-1]: text for action, text in shown_helps(train)}
    assert helps["--dp-codec"].endswith("(default: the plan's per-stage choice, else none)")
    assert helps["--lr"].endswith("(default: 0.003)")
    assert "default" not in helps["--cluster"]


def test_a_help_that_states_its_default_is_kept_as_written():
    assert help_with_default("codec (default: the plan's)", "none") == "codec (default: the plan's)"
    assert help_with_default("steps", 30) == "steps (default: 30)"
    assert help_with_default("file (required)", None, required=True) == "file (required)"
    parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--a", default=3, help="a count")
    parser.add_argument("--b", required=True, help="a file")
    parser.add_argument("--c", default=None, help="optional")
    text = parser.format_help()
    assert "a count (default: 3)" in text and "a file\n" in text and "optional\n" in text


def test_no_help_text_names_the_install_or_the_python_prefix():
    """Defaults shown as a user types them (a preset name), never a path of this machine."""
    from paths import ROOT
    import sys

    machine = [str(ROOT), sys.prefix]
    assert len(PARSERS) > 20  # every command and bench
    for path, parser in PARSERS:
        text = parser.format_help()
        assert not [where for where in machine if where in text], f"{path}: {text}"


def test_bench_wan_and_chaos_default_to_the_cluster_name():
    for path in ("geotrain bench wan", "geotrain bench chaos"):
        parser = dict(PARSERS)[path]
        cluster = next(text for action, text in shown_helps(parser) if "--cluster" in action.option_strings)
        assert "wan-4x1" in cluster and "/" not in cluster.replace("FILE|PRESET", ""), f"{path}: {cluster}"
