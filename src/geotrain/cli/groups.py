"""Command groups (`geotrain demo ...`, `geotrain bench ...`) whose subcommands live in their own modules.

A subcommand module defines NAME, HELP, add_arguments(parser) and run(args) -> int. Heavy imports
(torch) belong inside run(), so that `geotrain plan` starts fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from geotrain.cli.help_format import DefaultsHelpFormatter

DEMO_MODULES: tuple[str, ...] = (
    "geotrain.cli.demo_schedule",
    "geotrain.cli.demo_compress",
)

BENCH_MODULES: tuple[str, ...] = (
    "geotrain.cli.bench_plan",
    "geotrain.cli.bench_scale",
    "geotrain.cli.bench_seeds",
    "geotrain.cli.bench_codecs",
    "geotrain.cli.bench_runtime",
    "geotrain.cli.bench_ddp",
    "geotrain.cli.bench_netlab",
    "geotrain.cli.bench_wan",
    "geotrain.cli.bench_chaos",
    "geotrain.cli.bench_hetero",
    "geotrain.cli.bench_pipeline",
)


def register_group(subparsers: Any, name: str, help_text: str, module_names: tuple[str, ...]) -> None:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    children = parser.add_subparsers(dest=f"{name}_command", metavar="NAME", required=True)
    for module_name in module_names:
        module = importlib.import_module(module_name)
        # argparse %-formats `help` (not `description`): a literal % must be doubled there
        child = children.add_parser(module.NAME, help=module.HELP.replace("%", "%%"), description=module.HELP,
                                    formatter_class=DefaultsHelpFormatter)
        module.add_arguments(child)
        child.set_defaults(handler=module.run)


def register(subparsers: Any) -> None:
    register_group(subparsers, "demo", "the seed's demos, reproduced as tables", DEMO_MODULES)
    register_group(subparsers, "bench", "benchmarks: tables of speed and quality, --json for machines", BENCH_MODULES)
