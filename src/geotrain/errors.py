"""The root of geotrain's user-facing errors: the CLI prints them as one line and exits 2.

Every message is one line of at most MAX_MESSAGE_CHARS characters, and every value a message echoes
goes through `shown` (at most MAX_SHOWN_CHARS characters, cut with an ellipsis), so that a hostile or
huge input cannot produce a huge error line.
"""

from __future__ import annotations

import reprlib
from typing import Any

MAX_SHOWN_CHARS = 80
MAX_MESSAGE_CHARS = 1000
ELLIPSIS = "…"

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = MAX_SHOWN_CHARS + 2  # the cut below is the one that counts
_REPR.maxother = MAX_SHOWN_CHARS + 2
_REPR.maxlong = 40


def cut(text: str, limit: int) -> str:
    """`text` on one line, cut to at most `limit` characters (the last one an ellipsis when cut)."""
    text = " ".join(text.splitlines())
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def shown(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """A value as an error message echoes it: its repr, bounded in depth and length."""
    try:
        # a long string is cut at its end (reprlib would cut its middle)
        text = repr(value[: limit + 1]) if isinstance(value, (str, bytes)) else _REPR.repr(value)
    except (ValueError, RecursionError):  # e.g. an int too long to print
        text = f"<{type(value).__name__}>"
    return cut(text, limit)


class GeotrainError(Exception):
    """Bad input from a user (file, option, plan...). Subclasses also derive from ValueError/TypeError.

    A single string argument is made one line and cut to MAX_MESSAGE_CHARS.
    """

    def __init__(self, *args: Any) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            args = (cut(args[0], MAX_MESSAGE_CHARS),)
        super().__init__(*args)
