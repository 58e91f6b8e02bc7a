"""argparse `type=` helpers shared by every command, so one option kind is checked one way everywhere."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

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


def output_file(text: str) -> str:
    """A file path that a command can write at the end of its work, checked before the work starts:
    not a directory, in an existing writable directory (nothing is created; a symbolic link to a file not yet
    written is checked as its target, which the write creates). argparse reports anything else as a usage error
    naming the option."""
    path = Path(text)
    if text and path.is_symlink() and not path.exists():  # a dangling link: the write creates its target
        target = os.path.realpath(path)
        if Path(target).is_symlink():  # realpath stops where the links go round in a circle
            raise argparse.ArgumentTypeError(f"{shown(text)}: a symbolic link that loops")
        output_file(target)
        return text
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"must be a file path, got the directory {shown(text)}")
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{shown(text)}: directory {shown(str(parent))} {what}")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{shown(text)}: not writable")
    if not path.exists():  # access() says yes to root under /proc and /sys: make the file once, and remove it
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            path.unlink(missing_ok=True)
        except FileExistsError:  # made meanwhile, e.g. by another rank of a torchrun job checking the same path
            if not os.access(path, os.W_OK):
                raise argparse.ArgumentTypeError(f"{shown(text)}: not writable") from None
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"{shown(text)}: not writable ({exc.strerror or exc})") from None
    return text


def plot_file(text: str) -> str:
    """An `output_file` whose extension matplotlib can write (.png, .pdf, .svg...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(text).suffix.lower().lstrip(".")
    if suffix not in formats:
        raise argparse.ArgumentTypeError(f"{shown(text)}: a plot file ends in one of "
                                         f"{', '.join('.' + f for f in sorted(formats))}")
    return output_file(text)


MAX_SEED = 2**32 - 1  # numpy's legacy seeding takes 0..2^32-1


def _integer(text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in {low}..{high}, got {shown(text)}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be an integer in {low}..{high}, got {value}")
    return value


def seed(text: str) -> int:
    """An RNG seed: an integer in 0..2^32-1."""
    return _integer(text, 0, MAX_SEED)


def count(text: str) -> int:
    """A count of things to do (seeds, repeats): an integer in 1..10^6."""
    return _integer(text, 1, 10**6)


def bandwidth_gbps(text: str) -> float:
    """A bandwidth in Gbit/s in the range cluster files allow (1e-6..1e6), or inf (unlimited)."""
    from geotrain.cluster.model import MAX_GBPS, MIN_GBPS

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (MIN_GBPS <= value <= MAX_GBPS or value == math.inf):
        raise argparse.ArgumentTypeError(f"must be a bandwidth in {MIN_GBPS:g}..{MAX_GBPS:g} Gbit/s (or inf: "
                                         f"unlimited), got {shown(text)}")
    return value

