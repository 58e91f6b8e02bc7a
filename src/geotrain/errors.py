"""The root of geotrain's user-facing errors: the CLI prints them as one line and exits 2."""

from __future__ import annotations


class GeotrainError(Exception):
    """Bad input from a user (file, option, plan...). Subclasses also derive from ValueError/TypeError."""
