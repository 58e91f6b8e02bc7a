"""`geotrain` command line: one module per command, each with register(subparsers)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from geotrain import __version__
from geotrain.cli.output import writing_stdout
from geotrain.errors import GeotrainError
from geotrain.procs.exit import exit_without_teardown

# Each module defines register(subparsers) for the commands named here and sets `handler(args) -> int`
# on their parsers. A command line that names a command imports that command's module only: the
# others import torch or scipy (about 3 s of start-up at every call of `geotrain plan`).
COMMAND_MODULES: dict[str, str] = {
    "plan": "geotrain.cli.plan_cmd",
    "cost": "geotrain.cli.cost_cmd",
    "cluster": "geotrain.cli.cluster_cmd",
    "train": "geotrain.cli.train_cmd",
    "data": "geotrain.cli.data_cmd",
    "demo": "geotrain.cli.groups",
    "bench": "geotrain.cli.groups",
    "emulate": "geotrain.cli.emulate_cmd",
    "netlab": "geotrain.cli.netlab_cmd",
    "probe": "geotrain.cli.probe_cmd",
    "report": "geotrain.cli.report_cmd",
    "calibrate": "geotrain.cli.calibrate_cmd",
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or only of the command `argv` names (its first word); `geotrain
    --help`, `--version` and unknown commands get every command."""
    parser = argparse.ArgumentParser(
        prog="geotrain", allow_abbrev=False,
        description="Plan and run foundation-model training across slow, heterogeneous, geo-distributed networks.",
    )
    parser.add_argument("--version", action="version", version=f"geotrain {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    command = argv[0] if argv else None
    every = list(dict.fromkeys(COMMAND_MODULES.values()))
    modules = [COMMAND_MODULES[command]] if command in COMMAND_MODULES else every
    for module_name in modules:
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
    """The `geotrain` program. With `argv` it returns the exit code. As a program (argv None) every
    temporary file goes under one run directory that is removed at exit (geotrain.procs.rundir), and
    it ends the process itself (`procs.exit.exit_without_teardown`)."""
    if argv is None:
        from geotrain.procs.rundir import run_directory

        with run_directory():
            code = _main(None)
        exit_without_teardown(code)
    return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(words).parse_args(words)
    args.words = tuple(words)  # as typed: `train` repeats them in its resume command after a Ctrl-C
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
