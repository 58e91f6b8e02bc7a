"""A stdout that cannot be written (/dev/full, a full disk) ends the command with one line on stderr
and exit status 2, for tables and for --json alike; never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_stdout_on_dev_full_is_one_line(extra):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "geotrain", "plan", "--cluster", "seed-geo", "--stages", "2",
                               "--replicas", "2", *extra], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == "geotrain: error: cannot write to standard output: No space left on device\n"
