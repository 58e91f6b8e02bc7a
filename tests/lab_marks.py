"""Pytest marks of tests that build network labs (tests/ is on sys.path: pyproject's pytest pythonpath)."""

import os

import pytest

NEEDS_LAB = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/proc/self/ns/net"),
                               reason="netlab needs root and network namespaces (run the suite as root on Linux)")
"""Skip unless this process can create network namespaces (root on Linux)."""
