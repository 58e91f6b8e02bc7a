"""argparse `type=` helpers shared by every command, so one option kind is checked one way everywhere."""

from __future__ import annotations

import argparse
import math

from geotrain.errors import shown


def positive_float(text: str) -> float:
    """A finite number > 0 (time limits, timeouts in seconds); argparse reports anything else as a usage error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {shown(text)}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {shown(text)}")
    return value
