"""The run's settings as a TOML file: one table per section (`[run]`, `[comm]`, ...), keys as in
runtime/sections.py.

    settings = read_config_file("run.toml")        # {section: {key: value}}, keys checked
    text = config_toml(config.sections())          # what --print-config writes; read back equal

Settings come in layers (the plan's choices, then the file, then the flags), merged by
`merge_settings`. A tiny writer (no dependency) for the flat values the sections hold: bool, int,
float, str, codec specs (as their text) and lists of those; an unset (None) value is written as a
comment, so reading the file back leaves it unset.
"""

from __future__ import annotations

import json
import math
import numbers
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from geotrain.codecs import CodecSpec
from geotrain.runtime.config import section_types
from geotrain.runtime.sections import RuntimeConfigError, Section

Settings = dict[str, dict[str, Any]]


def file_keys() -> dict[str, tuple[str, ...]]:
    """The keys a file may set, per section (not the internal ones, e.g. the model's GPTConfig)."""
    return {section.SECTION: tuple(f.name for f in fields(section) if not f.metadata.get("internal"))
            for section in section_types()}


def read_config_file(path: str | Path) -> Settings:
    """{section: {key: value}} of a TOML file; unknown sections/keys and bad TOML: one-line errors."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise RuntimeConfigError(f"--config {str(path)!r}: cannot read it ({exc.__class__.__name__})") from None
    except tomllib.TOMLDecodeError as exc:
        raise RuntimeConfigError(f"--config {str(path)!r}: not TOML: {exc}") from None
    return check_settings(doc, f"--config {str(path)!r}")


def check_settings(doc: dict[str, Any], source: str) -> Settings:
    """`doc` as settings when every section and key is known (one-line error naming section.key if not)."""
    known = file_keys()
    for name, table in doc.items():
        if name not in known:
            raise RuntimeConfigError(f"{source}: unknown section {name!r} (sections: {', '.join(known)})")
        if not isinstance(table, dict):
            raise RuntimeConfigError(f"{source}: {name} must be a table ([{name}]), got {table!r}")
        for key in table:
            if key not in known[name]:
                raise RuntimeConfigError(f"{source}: unknown key {name}.{key} ({name} keys: {', '.join(known[name])})")
    return {name: dict(table) for name, table in doc.items()}


CLEARS = {"dp_codec": "dp_codecs", "pp_codec": "pp_codecs"}
"""A codec given for every stage (cut) replaces the per-stage (per-cut) codecs of the layers below."""


def merge_settings(*layers: Settings) -> Settings:
    """The layers merged, later ones winning per key."""
    merged: Settings = {}
    for layer in layers:
        for name, table in layer.items():
            section = merged.setdefault(name, {})
            section.update(table)
            for key, listed in CLEARS.items():
                if key in table and listed not in table:
                    section.pop(listed, None)
    return merged


def config_toml(sections: dict[str, Section]) -> str:
    """The sections as TOML: one table each, a comment with each key's help (and its flag where the flag is
    not --the-key, e.g. model_name's --model); unset values commented out."""
    lines = ["# geotrain train settings (geotrain train --config FILE; flags override them)"]
    for name, section in sections.items():
        lines += ["", f"[{name}]"]
        for f in fields(section):
            if f.metadata.get("internal"):
                continue
            value = getattr(section, f.name)
            flag = f.metadata.get("flag")  # None: --the-key; "": the file's only
            lines.append(f"# {f.metadata['help']}" + (f" (flag {flag})" if flag else ""))
            lines.append(f"# {f.name} is unset" if value is None else f"{f.name} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """One flat value as TOML text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (str, CodecSpec)):
        # a JSON string is a TOML basic string (raw non-ASCII: TOML refuses \\u surrogate pairs), DEL escaped
        return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise RuntimeConfigError(f"cannot write {value!r} as TOML")
