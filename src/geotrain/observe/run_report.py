"""`geotrain report`'s data: a run directory read (geotrain.observe.lines: bad lines skipped and counted)
and summed up (geotrain.observe.report), as one JSON-ready dict that the CLI prints as tables or as JSON.

    {"run_dir", "about", "split", "holding_back", "events", "observer_cost", "skipped_lines", "notes",
     "incomplete", "steps", "ranks"}

`incomplete` is None for a run whose every rank ended normally, else {"ranks": {rank: why}}: a rank whose
last start (or restart) is followed by a `failure` event, or by no `end` record (a killed process), and a rank
that run.json lists, or whose metrics file is there, but that left no readable line. `split` is None without
a readable step line.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from geotrain.errors import cut
from geotrain.observe.lines import RunLines, load_lines
from geotrain.observe.report import holding_back, observer_cost, time_split
from geotrain.observe.rundir import read_about

MAX_REASON_CHARS = 200


def _listed_ranks(about: dict[str, Any]) -> set[int]:
    """The ranks run.json describes (entries that are not {"rank": int} are ignored)."""
    ranks = about.get("ranks")
    if not isinstance(ranks, list):
        return set()
    return {r["rank"] for r in ranks if isinstance(r, dict) and isinstance(r.get("rank"), int)
            and not isinstance(r.get("rank"), bool)}


def incomplete_ranks(lines: RunLines, about: dict[str, Any]) -> dict[int, str]:
    """{rank: why it did not end normally} (module doc); {} for a complete run."""
    status: dict[int, str | None] = {}
    for record in lines.records:
        rank = record["rank"]
        status.setdefault(rank, "no end record (the process was killed or is still running)")
        if record["kind"] != "event":
            continue
        if record["event"] in ("start", "restart"):
            status[rank] = "no end record (the process was killed or is still running)"
        elif record["event"] == "end":
            status[rank] = None
        elif record["event"] == "failure":
            reason = record.get("reason", record.get("message"))
            status[rank] = cut(f"failure: {reason}" if reason is not None else "failure", MAX_REASON_CHARS)
    for rank in (_listed_ranks(about) | set(lines.file_ranks)) - set(status):
        status[rank] = "no readable metrics line"
    return {rank: why for rank, why in sorted(status.items()) if why is not None}


def run_report(run_dir: Path | str, lines: RunLines | None = None) -> dict[str, Any]:
    """The report of `run_dir` (module doc), from its `lines` where the caller has read them already. Never
    raises on what the files hold; an unreadable run.json or metrics file is a note."""
    run_dir = Path(run_dir)
    lines = load_lines(run_dir) if lines is None else lines
    about, about_note = read_about(run_dir)
    steps, events = lines.steps, lines.events
    split = time_split(steps) if steps else None
    # an outer sync is counted once, where it lands
    counts = dict(Counter(e["event"] for e in events if e["event"] not in ("start", "end")
                          and e.get("phase") != "start"))
    missing = incomplete_ranks(lines, about)
    return {"run_dir": str(run_dir), "about": about, "split": split,
            "holding_back": None if split is None else holding_back(split), "events": counts,
            "observer_cost": observer_cost(steps, events) if steps else None,
            "skipped_lines": lines.skipped, "notes": [*([about_note] if about_note else []), *lines.notes],
            "incomplete": {"ranks": missing} if missing else None,
            "steps": len(steps), "ranks": len({s["rank"] for s in steps})}
