"""Reading a run directory's metrics lines back, whatever the files hold: every reader (geotrain report,
finish_run's trace and TensorBoard files) goes through `load_lines`.

A line is kept when it is UTF-8 JSON, an object, of a known kind, with the fields its readers use of the
right type and range (`why_bad`); any other line is skipped and counted, with a note naming the file, the
line and why. A rank file that is not a regular file (a directory, a FIFO, a device) or cannot be read is
skipped with a note. A line torn by a killed writer ends without a newline: at the end of a file it is
skipped; in the middle (an elastic group's relaunched process appends to the same file) the next record
follows it on the same line, and that record is kept.

The normal form of a kept record: every optional field of its kind present (None where the line lacks it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geotrain.observe.metrics import METRICS_DIR

MAX_NOTES = 10
"""Notes kept per run (the count covers every skipped line)."""
RECORD_START = '{"kind":'
"""How every record the writers make begins (compact separators): where a record after a torn one starts."""


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= -1


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _amount(value: Any) -> bool:
    return _real(value) and value >= 0


def _text(value: Any) -> bool:
    return isinstance(value, str)


_Check = Callable[[Any], bool]
STEP_REQUIRED: dict[str, tuple[_Check, str]] = {
    "step": (_count, "an integer >= 0"), "rank": (_count, "an integer >= 0"), "stage": (_count, "an integer >= 0"),
    "replica": (_count, "an integer >= 0"), "site": (_text, "text"), "t_wall": (_amount, "seconds >= 0"),
    "step_s": (_amount, "seconds >= 0")}
STEP_OPTIONAL: dict[str, tuple[_Check, str]] = {
    **{key: (_amount, "a finite number >= 0") for key in (
        "compute_s", "comm_s", "wait_s", "bytes_intra", "bytes_inter", "bytes_dp", "bytes_pp", "tokens", "lr",
        "grad_norm", "emulated_start_s", "emulated_end_s")},
    "loss": (_real, "a finite number"), "val_loss": (_real, "a finite number"), "device": (_count, "an integer >= 0"),
    "progress_step": (_count, "an integer >= 0"), "global_updates": (_count, "an integer >= 0")}
EVENT_REQUIRED: dict[str, tuple[_Check, str]] = {
    "event": (_text, "text"), "step": (_step, "an integer >= -1 (-1: the end event)"),
    "rank": (_count, "an integer >= 0"), "t_wall": (_amount, "seconds >= 0")}
EVENT_OPTIONAL: dict[str, tuple[_Check, str]] = {"emulated_s": (_amount, "seconds >= 0"), "site": (_text, "text")}
EVENT_FIELDS: dict[str, dict[str, tuple[_Check, str]]] = {
    "outer_sync": {"phase": (lambda v: v in ("start", "land"), "start or land"),
                   "fragment": (_count, "an integer >= 0")},
    "end": {"steps": (_count, "an integer >= 0"), "observer_s": (_amount, "seconds >= 0"),
            "bytes_written": (_amount, "bytes >= 0")}}
LANDING_FIELDS: dict[str, tuple[_Check, str]] = {"started": (_count, "an integer >= 0"),
                                                 "bytes": (_amount, "bytes >= 0")}


def _fields(record: dict[str, Any], checks: dict[str, tuple[_Check, str]], required: bool) -> str | None:
    for key, (ok, what) in checks.items():
        value = record.get(key)
        if value is None:
            if required:
                return f"no {key!r}"
        elif not ok(value):
            return f"{key!r} is not {what}"
    return None


def why_bad(record: Any) -> str | None:
    """Why a parsed line cannot be read as a record (module doc), None when it can."""
    if not isinstance(record, dict):
        return "not a JSON object"
    kind = record.get("kind")
    if kind == "step":
        why = _fields(record, STEP_REQUIRED, True) or _fields(record, STEP_OPTIONAL, False)
        if why is None and record.get("compute_s") is not None and (record.get("comm_s") is None
                                                                    or record.get("wait_s") is None):
            why = "'compute_s' without 'comm_s' and 'wait_s'"
        return why
    if kind == "event":
        why = _fields(record, EVENT_REQUIRED, True) or _fields(record, EVENT_OPTIONAL, False)
        if why is None:
            why = _fields(record, EVENT_FIELDS.get(record["event"], {}), True)
        if why is None and record["event"] == "outer_sync" and record["phase"] == "land":
            why = _fields(record, LANDING_FIELDS, True)
        return why
    return "no 'kind' step or event"


def normal(record: dict[str, Any]) -> dict[str, Any]:
    """A kept record with every optional field of its kind present (None where absent)."""
    optional = STEP_OPTIONAL if record["kind"] == "step" else EVENT_OPTIONAL
    return {**dict.fromkeys(optional), **record}


@dataclass(frozen=True)
class RunLines:
    """The readable records of a run's metrics files (file order: rank files sorted, lines in order), how many
    lines were skipped, notes on what was skipped (at most MAX_NOTES, then a count of the rest), and the ranks
    whose files there are (by their names, readable or not)."""

    records: tuple[dict[str, Any], ...]
    skipped: int
    notes: tuple[str, ...]
    file_ranks: tuple[int, ...] = ()

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == "step"]

    @property
    def events(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == "event"]


def parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(the record, None) of one line's bytes (its newline stripped), or (None, why it is skipped)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        record = json.loads(text)  # NaN and Infinity parse, and fail the range checks
    except (ValueError, RecursionError):
        return None, "not JSON"
    why = why_bad(record)
    return (None, why) if why else (normal(record), None)


def _split_torn(raw: bytes) -> list[bytes]:
    """A line as its writers' records: a torn record followed by a whole one on the same line splits in two."""
    at = raw.rfind(RECORD_START.encode(), 1)
    if at < 0:
        return [raw]
    head, tail = raw[:at], raw[at:]
    return [head, tail] if parse_line(head)[0] is None and parse_line(tail)[0] is not None else [raw]


def _file_lines(path: Path) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) of a file's whole lines, then (n, None) for a torn last line."""
    with path.open("rb") as handle:
        for n, raw in enumerate(handle, 1):
            if raw.endswith(b"\n"):
                yield n, raw[:-1]
            else:
                yield n, None


def load_lines(run_dir: Path | str) -> RunLines:
    """Every readable record of run_dir/metrics/rank-*.jsonl, the count of skipped lines, notes (module doc)."""
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    skipped = 0
    file_ranks = []
    for path in sorted((Path(run_dir) / METRICS_DIR).glob("rank-*.jsonl")):
        name = f"{METRICS_DIR}/{path.name}"
        rank = path.name[len("rank-"):-len(".jsonl")]
        if rank.isascii() and rank.isdigit():
            file_ranks.append(int(rank))
        if not path.is_file():
            notes.append(f"{name}: not a regular file, skipped")
            continue
        try:
            for n, raw in _file_lines(path):
                if raw is None:
                    skipped += 1
                    notes.append(f"{name} line {n}: torn last line (a writer stopped mid-line)")
                    continue
                for part in _split_torn(raw):
                    record, why = parse_line(part)
                    if record is None:
                        skipped += 1
                        notes.append(f"{name} line {n}: {why}")
                    else:
                        records.append(record)
        except OSError as exc:
            notes.append(f"{name}: unreadable ({exc.strerror or exc}), skipped from there")
    shown = notes[:MAX_NOTES] + ([f"... and {len(notes) - MAX_NOTES} more"] if len(notes) > MAX_NOTES else [])
    return RunLines(tuple(records), skipped, tuple(shown), tuple(sorted(file_ranks)))
