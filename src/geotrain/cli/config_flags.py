"""Command-line flags generated from the config sections (geotrain.runtime.sections): one flag per
setting, its help and default read from the field, so each default is written once.

    add_config_flags(parser)              # --steps, --dp-codec, --no-error-feedback, ...
    given = flag_settings(args)           # {section: {key: value}} of the flags actually given
    words = config_argv(config.sections())  # the flags that reproduce non-default settings
    with errors_name_flags(args): ...     # "--steps must be ...", not "run.steps must be ...", for flags given

Flags default to "not given" (argparse.SUPPRESS), so a flag overrides a --config file only when it
is on the command line; the help shows the field's default.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import MISSING, Field, fields
from typing import Any

from geotrain.cli.help_format import help_with_default
from geotrain.codecs import CodecSpec
from geotrain.runtime.config import section_types
from geotrain.runtime.sections import NO_FLAG, RuntimeConfigError, Section


def flag_of(f: Field) -> str | None:
    """The flag of a setting (None: not on the command line)."""
    if f.metadata.get("internal") or f.metadata.get("flag") == NO_FLAG:
        return None
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _value_type(section: type[Section], f: Field) -> type:
    """The flag's argparse type: the field's type without None (codec specs as text)."""
    kind = typing.get_type_hints(section)[f.name]
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    return str if kind is CodecSpec else kind


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting of every section, in section order."""
    for section in section_types():
        group = parser.add_argument_group(f"[{section.SECTION}] settings", (section.__doc__ or "").strip())
        for f in fields(section):
            flag = flag_of(f)
            if flag is None:
                continue
            default = f.default if f.default is not MISSING else None
            shown = str(default) if isinstance(default, CodecSpec) else default
            help_text = help_with_default(f.metadata["help"], shown).replace("%", "%%")
            kind = _value_type(section, f)
            options: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
            if kind is bool:
                options["action"] = "store_false" if default else "store_true"
            else:
                options["type"] = kind
                for key in ("metavar", "choices"):
                    if f.metadata.get(key) is not None:
                        options[key] = f.metadata[key]
            group.add_argument(flag, **options)


def flag_settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """{section: {key: value}} of the config flags given on the command line."""
    given: dict[str, dict[str, Any]] = {}
    for section in section_types():
        for f in fields(section):
            if flag_of(f) is not None and hasattr(args, f.name):
                given.setdefault(section.SECTION, {})[f.name] = getattr(args, f.name)
    return given


def config_argv(sections: dict[str, Section]) -> list[str]:
    """The flags that set every flag-settable value of `sections` that differs from its default."""
    words: list[str] = []
    for section in sections.values():
        for f in fields(section):
            flag, value = flag_of(f), getattr(section, f.name)
            if flag is None or value == f.default:
                continue
            words += [flag] if isinstance(value, bool) else [flag, str(value)]
    return words


def given_flags(args: argparse.Namespace) -> dict[str, str]:
    """{"section.key": "--flag"} of the config flags given on the command line."""
    return {f"{section.SECTION}.{f.name}": flag for section in section_types() for f in fields(section)
            for flag in [flag_of(f)] if flag is not None and hasattr(args, f.name)}


def name_flags(message: str, flags: dict[str, str]) -> str:
    """`message` with each `section.key` of `flags` written as the flag the user typed ("run.steps must be"
    -> "--steps must be"); keys of a --config file's values stay as they are."""
    for key, flag in flags.items():
        message = re.sub(rf"(?<![\w.-]){re.escape(key)}(?![\w])", flag, message)
    return re.sub(r"^(--[\w-]+): \1 ", r"\1 ", message)  # "--model: --model 'x': ..." says the flag once


def setting_flags(settings: dict[str, dict[str, Any]]) -> dict[str, str]:
    """{"section.key": "--flag value"} of the flag-settable values of `settings` ({section: {key: value}}; a
    true switch as its flag alone)."""
    out: dict[str, str] = {}
    for section in section_types():
        for f in fields(section):
            flag = flag_of(f)
            if flag is None or f.name not in settings.get(section.SECTION, {}):
                continue
            value = settings[section.SECTION][f.name]
            shown = ",".join(str(v) for v in value) if isinstance(value, tuple) else str(value)
            out[f"{section.SECTION}.{f.name}"] = flag if value is True else f"{flag} {shown}"
    return out


@contextmanager
def errors_name_flags(args: argparse.Namespace, plan: tuple[str, dict[str, dict[str, Any]]] | None = None
                      ) -> Iterator[None]:
    """A RuntimeConfigError raised inside names the flags given on the command line, not their keys; with
    `plan` (its path and the settings it brought that no flag or --config file overrode), the settings of the
    plan's the message names are said to be the plan's, as their flags ("--local-steps adaptive ... (set by the
    plan plan.json: --local-steps adaptive)"): the user typed neither."""
    try:
        yield
    except RuntimeConfigError as exc:
        flags = given_flags(args)
        brought = {} if plan is None else {key: shown for key, shown in setting_flags(plan[1]).items()
                                           if key not in flags}
        plan_flags = {key: shown.split(" ")[0] for key, shown in brought.items()}
        message = name_flags(str(exc), {**flags, **plan_flags})
        named = [brought[key] for key, flag in plan_flags.items()
                 if re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", message)]
        if named and plan is not None:
            message += f" (set by the plan {plan[0]}: {', '.join(named)})"
        raise RuntimeConfigError(message) from None
