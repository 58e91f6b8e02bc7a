"""`geotrain` command line: one module per command, each with register(subparsers)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from geotrain import __version__
from geotrain.cli.output import writing_stdout
from geotrain.errors import GeotrainError

# Each module defines register(subparsers) and sets `handler(args) -> int` on its parser.
COMMAND_MODULES: tuple[str, ...] = (
    "geotrain.cli.plan_cmd",
    "geotrain.cli.cost_cmd",
    "geotrain.cli.cluster_cmd",
    "geotrain.cli.train_cmd",
    "geotrain.cli.data_cmd",
    "geotrain.cli.groups",
    "geotrain.cli.emulate_cmd",
    "geotrain.cli.netlab_cmd",
    "geotrain.cli.probe_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geotrain", allow_abbrev=False,
        description="Plan and run foundation-model training across slow, heterogeneous, geo-distributed networks.",
    )
    parser.add_argument("--version", action="version", version=f"geotrain {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    refuse_abbreviations(parser)
    return parser


def refuse_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Turn off argparse's prefix matching on `parser` and every sub-command parser under it: an
    abbreviation like `--over` would silently mean `--overwrite` (and delete checkpoints)."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                refuse_abbreviations(child)


def main(argv: Sequence[str] | None = None) -> int:
    """The `geotrain` program; as a program (argv None) every temporary file goes under one run
    directory that is removed at exit (geotrain.procs.rundir)."""
    if argv is None:
        from geotrain.procs.rundir import run_directory

        with run_directory():
            return _main(None)
    return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.handler(args) or 0)
        with writing_stdout():  # what print() left buffered fails here, not in the interpreter's exit
            sys.stdout.flush()
        return code
    except GeotrainError as exc:
        print(f"geotrain: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("geotrain: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
