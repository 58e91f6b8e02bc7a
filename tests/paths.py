"""Where the repository is, for tests in any folder of tests/ (tests/ is on sys.path: pyproject's pytest pythonpath)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository root (src/, examples/, tests/data/ below it)."""
