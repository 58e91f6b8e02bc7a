"""No file of the repository holds a merge's conflict markers (a merge once left them in a docs table for weeks)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKERS = ("<<<<<<< ", ">>>>>>> ")


def test_no_tracked_text_file_holds_conflict_markers():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".sh", ".json"} or not path.is_file():
            continue
        lines = path.read_text(errors="replace").splitlines()
        found += [f"{name}:{i + 1}" for i, line in enumerate(lines) if line.startswith(MARKERS)]
    assert found == []
