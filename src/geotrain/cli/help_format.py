"""One default per flag in `--help`.

argparse's ArgumentDefaultsHelpFormatter appends "(default: X)" to every option, even when the help
already says what the default is ("... (default: the plan's choice)") or when the flag is required.
Here the default is appended once, only where the help does not already state one, the flag is not
required and the default means something (not None, not argparse.SUPPRESS, not the False of an on/off
flag).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

# "(default: X)", "(default X)", "; default: X", ", default X": a help that names its default (not "the default
# bounds ...", which only talks about it)
_STATES_DEFAULT = re.compile(r"\(default\b|\bdefault:|[,;]\s*default\b", re.IGNORECASE)


def states_default(help_text: str | None) -> bool:
    """Whether a help text already says what its default is (or is a %(default)s template)."""
    return bool(help_text) and ("%(default)" in help_text or bool(_STATES_DEFAULT.search(help_text)))


def help_with_default(help_text: str, default: Any, required: bool = False) -> str:
    """`help_text` with " (default: X)" appended, unless it states one, the flag is required or the
    default is None or a bool (an on/off flag: its name says what giving it does)."""
    if (required or default is None or default is argparse.SUPPRESS or isinstance(default, bool)
            or states_default(help_text)):
        return help_text
    return f"{help_text} (default: {default})"


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """ArgumentDefaultsHelpFormatter with one default per flag (see the module docstring)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help
        off_switch = action.nargs == 0 and action.default is False
        if (help_text is None or action.required or action.default in (None, argparse.SUPPRESS) or off_switch
                or states_default(help_text)):
            return help_text
        return super()._get_help_string(action)


class DefaultsRawDescriptionHelpFormatter(DefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """One default per flag, and the description and epilog kept as written."""
