"""The docs site's reference pages, generated from the code (mkdocs runs this at build time: docs/hooks.py).

    cli_markdown()      every command and flag, from the argparse parsers (as `--help` prints them)
    config_markdown()   every `geotrain train` config section and key, from geotrain.runtime.sections
    files_markdown()    the keys of cluster, job and plan files, from the sets their loaders accept
    composition_markdown()  which `geotrain train` settings run together, from geotrain.runtime.composition
    api_pages()         {page: markdown} of the public Python API (mkdocstrings `:::` directives)

Nothing here is a copy of a flag list or a default: the only text written here is one line per file
key (the loaders hold the key sets, without help), and `files_markdown` refuses a key set that gained or
lost a key this module does not describe.
"""

from __future__ import annotations

import argparse
import html
from dataclasses import MISSING, fields
from typing import Any

from geotrain.cli.main import build_parser

API_MODULES = ("geotrain.diloco", "geotrain.ddp", "geotrain.codecs", "geotrain.comm", "geotrain.sync",
               "geotrain.emulate", "geotrain.optim", "geotrain.cluster", "geotrain.job", "geotrain.plan",
               "geotrain.cost", "geotrain.search", "geotrain.models", "geotrain.data")
"""The modules of the Python API reference, one page each."""


def _cell(text: Any) -> str:
    """Text safe in a markdown table cell: one line, no pipes, no raw HTML; `code spans` kept as code."""
    parts = " ".join(str(text).split()).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code spans
        parts = ["'".join(parts)]
    # `[s][r]` outside code would be a reference link: brackets as entities
    safe = [html.escape(part, quote=False).replace("|", "&#124;").replace("[", "&#91;").replace("]", "&#93;")
            for part in parts]
    return "".join(f"<code>{part}</code>" if i % 2 else part for i, part in enumerate(safe))


def _code(text: Any) -> str:
    return f"<code>{_cell(str(text).replace('`', ''))}</code>"


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(path, parser) of every command that has its own flags, depth first, in the order of `--help`."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                child._reference_help = helps.get(name)  # the one-line summary the parent's --help shows
                found.extend(_commands(child, (*path, name)))
    return found


def _flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if action.help is argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        names = ", ".join(action.option_strings) or action.metavar or action.dest
        value = formatter._format_args(action, action.dest.upper()) if action.nargs != 0 else ""
        text = formatter._expand_help(action) if action.help else ""
        if action.required:
            text += " **(required)**" if "required" not in text else ""
        rows.append(f"| {_code(names)} | {_code(value) if value else ''} | {_cell(text)} |")
    return rows


def cli_markdown() -> str:
    """Every command with its usage line and a table of its flags, as `geotrain ... --help` prints them."""
    lines = ["# Command line", "",
             "Generated from geotrain's argparse parsers when the site is built: each table is what "
             "`geotrain COMMAND --help` prints. Commands that take a cluster accept a preset name or a "
             "YAML/JSON file ([file keys](files.md)); `geotrain train`'s settings are also "
             "[config keys](config.md).", ""]
    for path, parser in _commands(build_parser()):
        if not path:
            continue
        name = "geotrain " + " ".join(path)
        lines += [f"{'#' * min(len(path) + 1, 4)} `{name}`", ""]
        summary = getattr(parser, "_reference_help", None) or parser.description
        if summary:
            lines += [_cell(summary.replace("%%", "%")), ""]
        usage = parser.format_usage().strip().removeprefix("usage: ")
        lines += ["```text", usage, "```", ""]
        rows = _flag_rows(parser)
        if len(rows) > 1:  # more than -h
            lines += ["| flag | value | help |", "|---|---|---|", *rows, ""]
    return "\n".join(lines) + "\n"


def config_markdown() -> str:
    """Every section and key of a run's configuration (`geotrain train --config RUN.toml`)."""
    from geotrain.cli.config_flags import flag_of
    from geotrain.runtime.config import section_types

    lines = ["# Configuration (`--config RUN.toml`)", "",
             "Generated from `geotrain.runtime.sections` when the site is built. A run's settings come in "
             "sections; a TOML file holds one table per section, `geotrain train --print-config` prints the "
             "file of a command line, and each key with a flag can also be given on the command line (the "
             "flag wins over the file).", "",
             "```toml", "[run]", "steps = 30", "", "[comm]", 'dp_codec = "int8-block"', "```", ""]
    for section in section_types():
        lines += [f"## `[{section.SECTION}]`", "", _cell((section.__doc__ or "").strip()), "",
                  "| key | default | flag | help |", "|---|---|---|---|"]
        for f in fields(section):
            if f.metadata.get("internal") or "help" not in f.metadata:
                continue
            default = f.default if f.default is not MISSING else None
            flag = flag_of(f)
            shown = "unset" if default is None else _code(default)
            lines.append(f"| `{f.name}` | {shown} | {_code(flag) if flag else 'file only'} | "
                         f"{_cell(f.metadata['help'])} |")
        lines.append("")
    return "\n".join(lines) + "\n"


# One line per key that a loader accepts; the key sets themselves are the loaders' (checked below).
CLUSTER_KEYS = {
    "name": "the cluster's name (shown in tables and plans)",
    "regions": "compact form: a list of regions, each `{name, devices, gpu, intra, host, nic_gbps, memory_gib}`",
    "links": "compact form: `{between: [A, B], gbps, ms}` per region pair; every pair exactly once, symmetric",
    "defaults": "compact form: `{intra, link, gpu, nic_gbps, memory_gib}` applied where a region or link omits them",
    "devices": "dense form: a list of devices, each `{name, region, gpu, host, gpu_index, nic_gbps, memory_gib}`; "
               "compact form: the region's device count",
    "bandwidth_gbps": "dense form: N x N matrix of Gbit/s between devices",
    "latency_ms": "dense form: N x N matrix of one-way latency in ms",
    "gpu": "GPU type (V100, A100, H100, T4, ...: the compute models' peak table, checked when the file loads); "
           "default `unknown`; a compact region's may be a list, one type per device",
    "intra": "`{gbps, ms}` between two devices of the region",
    "link": "`{gbps, ms}` of region pairs the `links` list omits",
    "host": "the host a device (or each device of a region) lives on: ranks on one host share it",
    "nic_gbps": "the device's uplink in Gbit/s, shared by its concurrent sends (absent: unlimited)",
    "memory_gib": "GPU memory a job may use on the device, in GiB, where less than the GPU type's datasheet (a MIG "
                  "slice, a shared GPU; absent: the datasheet's); the planner's memory checks use it",
    "gpu_index": "the GPU's number on its host (integer 0..4095, unique per host)",
    "prices": "optional, both forms: `{gpu_hour: {TYPE: USD per GPU-hour, for every GPU type}, egress_per_gb: USD "
              "per GB leaving a region, one number or `{REGION: USD, default: USD}`}`; plans then say what a step "
              "costs (`plan --objective cost`)",
    "gpu_hour": "prices: USD per GPU-hour, by GPU type (every type of the cluster)",
    "egress_per_gb": "prices: USD per GB that leaves a region (traffic inside one is free)",
    "region": "the region a device belongs to",
    "between": "the two region names a link joins",
    "gbps": "bandwidth in Gbit/s (1e-6..1e6)",
    "ms": "latency in milliseconds (0..1e6)",
}
JOB_KEYS = {
    "name": "the job's name",
    "params": "model parameters (a number, e.g. 1.3e9)",
    "seq_len": "tokens per sequence",
    "hidden": "hidden width (activation bytes per token = hidden x bytes_per_value)",
    "global_batch": "sequences per iteration over all replicas (`plan` rounds it to the nearest multiple of R, "
                    "in a note)",
    "layers": "transformer layers (default 24): the pipeline cuts between them",
    "bytes_per_value": "bytes of one gradient or activation value (default 2)",
    "vocab": "vocabulary size (default 50257)",
    "model": "a known model shape whose figures fill the keys not given",
}
PLAN_KEYS = {
    "stages": "S, pipeline stages",
    "replicas": "R, data-parallel replicas",
    "assignment": "S lists of R device indices: `assignment[s][r]` runs stage s of replica r",
    "method": "the search method that found it",
    "cost": "`{dp, pp, total}` predicted communication seconds per iteration",
    "seconds": "search time in seconds",
    "microbatches": "pipeline micro-batches per iteration",
    "codecs": "the planner's codec choice per DP group and per pipeline cut (`plan --codecs auto`)",
    "split": "the layer split per stage (`plan --uneven-split`)",
    "shards": "sharded slots (`plan --shards K`): `{k: K, devices: [[[K device indices] x R] x S]}`, each (stage, "
              "replica) slot K devices of one site holding FSDP2 shards, `assignment` its first; absent: K = 1",
}


def _key_sets() -> dict[str, tuple[set[str], dict[str, str]]]:
    """The key sets each loader accepts, beside the descriptions above."""
    from geotrain.cluster import io as cluster_io
    from geotrain import job, plan

    cluster = set().union(cluster_io._COMPACT_KEYS, cluster_io._DENSE_KEYS, cluster_io._REGION_KEYS,
                          cluster_io._DEVICE_KEYS, cluster_io._LINK_KEYS, cluster_io._DEFAULT_KEYS,
                          cluster_io._FIGURE_KEYS, cluster_io._PRICE_KEYS)
    plan_keys = {"stages", "replicas", "assignment"} | {f.name for f in fields(plan.Plan)} - {"extra", "key_order"}
    return {"cluster": (cluster, CLUSTER_KEYS), "job": (set(job._JOB_KEYS), JOB_KEYS),
            "plan": (plan_keys, PLAN_KEYS)}


def files_markdown() -> str:
    """The keys of cluster, job and plan files (YAML or JSON)."""
    from geotrain.cluster import io as cluster_io

    sets = _key_sets()
    for kind, (accepted, described) in sets.items():
        if accepted != set(described):
            raise ValueError(f"{kind} file keys: the loader accepts {sorted(accepted)}, the reference "
                             f"describes {sorted(described)} (geotrain.cli.reference)")
    where = {"regions[]": cluster_io._REGION_KEYS, "devices[]": cluster_io._DEVICE_KEYS,
             "links[]": cluster_io._LINK_KEYS, "defaults": cluster_io._DEFAULT_KEYS,
             "intra, link": cluster_io._FIGURE_KEYS}
    lines = ["# Cluster, job and plan files", "",
             "Generated from the loaders' key sets when the site is built. All three are YAML or JSON, read "
             "strictly: an unknown key, a missing one or a value out of range is a one-line error naming the "
             "file, the key path and the value. Examples: `examples/clusters/`, `examples/jobs/`; presets: "
             "`geotrain cluster show PRESET`.", "",
             "## Cluster file", "",
             "Compact form (top level): " + ", ".join(f"`{k}`" for k in sorted(cluster_io._COMPACT_KEYS)) + ". "
             "Dense form (top level): " + ", ".join(f"`{k}`" for k in sorted(cluster_io._DENSE_KEYS)) + ".", "",
             "| where | keys |", "|---|---|"]
    lines += [f"| `{place}` | {', '.join(f'`{k}`' for k in sorted(keys))} |" for place, keys in where.items()]
    for kind, title in (("cluster", None), ("job", "## Job file"), ("plan", "## Plan file")):
        if title:
            lines += ["", title]
        if kind == "plan":
            lines += ["", "What `geotrain plan --json` writes and `train`/`cost`/`emulate --plan` read; other keys are "
                          "kept as read."]
        lines += ["", "| key | meaning |", "|---|---|"]
        lines += [f"| `{key}` | {_cell(text)} |"
                  for key, text in sorted(sets[kind][1].items())]
    return "\n".join(lines) + "\n"


def composition_markdown() -> str:
    """For every pair of `geotrain train` settings whether it runs, and each refusal's reason, from the rules
    that config validation reads (geotrain.runtime.composition)."""
    from geotrain.runtime import composition as table

    settings, rules = table.SETTINGS, table.RULES
    number = {rule: i for i, rule in enumerate(rules, 1)}
    refused = {frozenset((a.name, b.name)): table.pair_refusal(a.name, b.name) for a, b in table.pairs()}
    lines = ["# Composition (which `geotrain train` settings run together)", "",
             "Generated from `geotrain.runtime.composition` when the site is built: the same rules refuse a run "
             "when its configuration is checked, each in one `geotrain: error:` line naming both flags. A rule "
             "either holds by design or says *not built yet* (a later change can lift it). A setting brings what "
             "it needs (`--fragments` is DiLoCo's: `--sync-every`), so a pair is refused when any rule holds "
             "between the two settings and what they need. Each cell is checked by building its configuration "
             "(tests/unit/runtime/test_runtime_composition.py) on plain links (`--time-scale 0`, itself setting "
             "`links`); conditions of one setting or of three (values, ranges; elastic groups of S > 1 stages: GPipe, "
             "a plain split, kill chaos only) are checked beside the table by the section or module "
             "that owns them.", "",
             "| # | setting | flags | needs |", "|---|---|---|---|"]
    lines += [f"| {i} | `{s.name}` | {_code(s.flags)} | {', '.join(f'`{n}`' for n in s.needs)} |"
              for i, s in enumerate(settings, 1)]
    header = "| | " + " | ".join(str(i) for i in range(1, len(settings) + 1)) + " |"
    lines += ["", f"## Every pair ({len(refused)} pairs, {sum(r is not None for r in refused.values())} refused)", "",
              "A cell holds the number of the rule that refuses the pair (below), **·** where the pair runs, "
              "— where the two are values of one setting.", "", header,
              "|---|" + "---|" * len(settings)]
    for i, a in enumerate(settings, 1):
        cells = []
        for b in settings:
            pair = frozenset((a.name, b.name))
            cells.append("" if a is b else "—" if pair not in refused else
                         "·" if refused[pair] is None else f"**{number[refused[pair]]}**")
        lines.append(f"| {i} `{a.name}` | " + " | ".join(cells) + " |")
    lines += ["", "## The rules", "", "| # | settings | by design | reason | instead | refuses |",
              "|---|---|---|---|---|---|"]
    for rule in rules:
        count = sum(r is rule for r in refused.values())
        design = "yes" if rule.built else "not built yet"
        lines.append(f"| {number[rule]} | `{rule.first}` + `{rule.second}` | {design} | {_cell(rule.reason)} "
                     f"| {_cell(rule.instead)} | {count} pairs |")
    return "\n".join(lines) + "\n"


def api_pages() -> dict[str, str]:
    """{file name: markdown} of one page per public module, rendered by mkdocstrings."""
    return {f"{module}.md": f"# `{module}`\n\n::: {module}\n" for module in API_MODULES}
