"""The README's and the guide's examples run, so that none can rot.

Every fenced block of README.md, docs/index.md and docs/guide/*.md runs, page by page in nav order, in
one scratch directory (with `examples/` and `benchmarks/` linked in, as from the repository root):
  - ```bash / ```sh blocks: `bash -euo pipefail`, with this interpreter's bin first on PATH (`geotrain`);
  - ```python blocks: this interpreter, as a script;
  - other blocks (```text, ```toml, ```yaml: output and config shown to the reader) are not run;
Markers, an HTML comment on the line right above a block (invisible on the site and on GitHub):
  - `<!-- example: skip (why) -->`: the block is not run (long benches, root, several hosts, fragments);
  - `<!-- example: file NAME -->`: the block's text is written to NAME in the scratch directory (every
    page's files are written before any block runs, so a page may use another page's cluster file).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from paths import ROOT

PAGES = ("README.md", "docs/index.md", "docs/guide/quick-start.md", "docs/guide/placing-a-job.md",
         "docs/guide/training-a-plan.md", "docs/guide/running-across-real-sites.md", "docs/guide/slow-links.md",
         "docs/guide/surviving-failures.md",
         "docs/guide/emulating-any-script.md", "docs/guide/heterogeneous-sites.md",
         "docs/guide/heterogeneous-sites-diloco.md", "docs/guide/heterogeneous-sites-async.md",
         "docs/guide/watching-a-run.md")
RUN_LANGUAGES = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}
MARKER = re.compile(r"^<!--\s*example:\s*(skip|file)\b\s*(.*?)\s*-->$")
FENCE = re.compile(r"^```([\w+-]*)\s*$")
BLOCK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    marker: str | None  # "skip", "file" or None
    argument: str  # the skip reason or the file name

    @property
    def runs(self) -> bool:
        return self.marker is None and self.language in RUN_LANGUAGES


def blocks(page: str, text: str) -> list[Block]:
    """The fenced blocks of a markdown text, each with the marker on the line above it."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a fenced block is not closed")
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(above.strip())
        found.append(Block(page, i + 1, opening.group(1).lower(), "\n".join(lines[i + 1:end]) + "\n",
                           marker.group(1) if marker else None, marker.group(2) if marker else ""))
        i = end + 1
    return found


def page_blocks(page: str) -> list[Block]:
    return blocks(page, (ROOT / page).read_text())


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """One directory for every page (nav order), with each page's `file` blocks written in it."""
    where = tmp_path_factory.mktemp("docs-examples")
    for name in ("examples", "benchmarks"):
        (where / name).symlink_to(ROOT / name)
    for page in PAGES:
        for block in page_blocks(page):
            if block.marker == "file":
                (where / block.argument).write_text(block.text)
    return where


def run_block(block: Block, where: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "NO_COLOR": "1", "COLUMNS": "160", "PYTHONUNBUFFERED": "1"}
    if RUN_LANGUAGES[block.language] == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", block.text]
    else:
        script = where / f"example-{Path(block.page).stem}-{block.line}.py"
        script.write_text(block.text)
        argv = [sys.executable, str(script)]
    return subprocess.run(argv, cwd=where, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def test_markers_decide_what_runs():
    text = ("```bash\necho run\n```\n\n<!-- example: skip (long) -->\n```bash\nsleep 999\n```\n"
            "<!-- example: file c.yaml -->\n```yaml\nname: x\n```\n```text\noutput\n```\n```python\nprint(1)\n```\n")
    found = blocks("t.md", text)
    assert [(b.language, b.marker, b.argument, b.runs) for b in found] == [
        ("bash", None, "", True), ("bash", "skip", "(long)", False), ("yaml", "file", "c.yaml", False),
        ("text", None, "", False), ("python", None, "", True)]
    assert found[2].text == "name: x\n"


def test_every_page_has_examples_and_every_skip_says_why():
    for page in PAGES:
        found = page_blocks(page)
        assert any(b.runs for b in found) or page == "docs/index.md", page
        for block in found:
            assert block.marker != "skip" or block.argument.startswith("("), f"{page}:{block.line}: skip, no reason"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_pages_examples_run(page, scratch):
    for block in page_blocks(page):
        if not block.runs:
            continue
        done = run_block(block, scratch)
        assert done.returncode == 0, (f"{page}:{block.line} ({block.language}) exited {done.returncode}\n{block.text}"
                                      f"\n--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-3000:]}")


def test_every_guide_page_is_run():
    guide = {f"docs/guide/{page.name}" for page in (ROOT / "docs" / "guide").glob("*.md")}
    assert guide <= set(PAGES), sorted(guide - set(PAGES))
