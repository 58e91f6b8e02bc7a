"""Timelines in the Chrome trace event format (Perfetto, chrome://tracing): one process per rank.

    {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}

Every event is a complete event ("ph": "X", `ts` and `dur` in microseconds of emulated time, or of wall
time since the run's first record without emulation) or an instant ("ph": "i"):
  cat "transfer"   - one per entry of the emulator report's `transfers`: on its sender's process (pid =
                     src_rank), from its start to its arrival (start_s..end_s), args = the report's entry;
  cat "collective" - one per entry of its `ops`: on its first member's process, start_s..end_s;
  cat "step"       - a run's training steps, one per rank and step: args compute_s, comm_s, wait_s, loss;
  cat "sync"       - a run's outer syncs, one per rank and sync: from its "outer_sync" start event to its
                     landing (in flight over the steps between, with a sync delay); args fragment, started,
                     landed, bytes. A start without a landing (a run that failed meanwhile) is left out;
  cat "event"      - instants: checkpoints, failures, restarts, rejoins, re-plans (a run's other events).
Events of one kind on one rank may overlap (messages to several peers in flight at once), and a JSON
trace's slices on one thread must nest: each kind is laid out in lanes, threads "transfers 0", "transfers 1"...,
an event going to the first lane free at its start (a greedy interval colouring: no two overlap in a lane).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

US = 1e6
STEP_TID, EVENT_TID, SYNC_TID, COLLECTIVE_TID, TRANSFER_TID = 0, 10, 20, 100, 1000
"""First thread id of each kind's lanes on a rank's process."""


def _lanes(items: Sequence[tuple[int, float, float]]) -> list[int]:
    """A lane per (pid, start, end), in input order: the first lane of that pid free at `start`."""
    order = sorted(range(len(items)), key=lambda i: (items[i][0], items[i][1], items[i][2]))
    free: dict[int, list[float]] = {}
    lane = [0] * len(items)
    for i in order:
        pid, start, end = items[i]
        ends = free.setdefault(pid, [])
        k = next((k for k, busy_until in enumerate(ends) if busy_until <= start), len(ends))
        if k == len(ends):
            ends.append(end)
        else:
            ends[k] = end
        lane[i] = k
    return lane


def _complete(name: str, cat: str, pid: int, tid: int, start_s: float, end_s: float,
              args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": start_s * US,
            "dur": max(0.0, end_s - start_s) * US, "args": args}


def transfer_events(transfers: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One "transfer" event per emulator transfer entry (module doc)."""
    lanes = _lanes([(t["src_rank"], t["start_s"], t["end_s"]) for t in transfers])
    return [_complete(f"{t['op']} r{t['src_rank']}->r{t['dst_rank']}", "transfer", t["src_rank"],
                      TRANSFER_TID + lane, t["start_s"], t["end_s"], dict(t))
            for t, lane in zip(transfers, lanes, strict=True)]


def collective_events(ops: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One "collective" event per emulator op entry, on its first member's process."""
    lanes = _lanes([(o["ranks"][0], o["start_s"], o["end_s"]) for o in ops])
    return [_complete(f"{o['op']} group {o['group']}", "collective", o["ranks"][0], COLLECTIVE_TID + lane,
                      o["start_s"], o["end_s"], dict(o))
            for o, lane in zip(ops, lanes, strict=True)]


def step_events(steps: Sequence[dict[str, Any]], origin_wall: float) -> list[dict[str, Any]]:
    """One "step" event per metrics step record: emulated span, else wall span since `origin_wall`."""
    events = []
    for s in steps:
        if s.get("emulated_start_s") is not None:
            start, end = s["emulated_start_s"], s["emulated_end_s"]
        else:
            end = s["t_wall"] - origin_wall
            start = end - s["step_s"]
        args = {k: s[k] for k in ("step", "loss", "compute_s", "comm_s", "wait_s", "bytes_inter", "bytes_intra")}
        events.append(_complete(f"step {s['step']}", "step", s["rank"], STEP_TID, start, end, args))
    return events


def _event_s(event: dict[str, Any], origin_wall: float) -> float:
    """An event record's time: emulated seconds, else wall seconds since `origin_wall`."""
    return event["emulated_s"] if event.get("emulated_s") is not None else event["t_wall"] - origin_wall


def sync_events(events: Sequence[dict[str, Any]], origin_wall: float) -> list[dict[str, Any]]:
    """One "sync" span per outer sync that landed: its "outer_sync" start and land records matched by rank,
    fragment and the step it started after (module doc)."""
    starts = {(e["rank"], e["fragment"], e["step"]): e for e in events
              if e["event"] == "outer_sync" and e.get("phase") == "start"}
    spans = []
    for land in (e for e in events if e["event"] == "outer_sync" and e.get("phase") == "land"):
        start = starts.get((land["rank"], land["fragment"], land["started"]))
        if start is not None:
            args = {"fragment": land["fragment"], "started": land["started"], "landed": land["step"],
                    "bytes": land["bytes"]}
            spans.append((land["rank"], _event_s(start, origin_wall), _event_s(land, origin_wall), args))
    lanes = _lanes([(rank, begin, end) for rank, begin, end, _ in spans])
    return [_complete(f"outer sync f{args['fragment']} (step {args['started']})", "sync", rank, SYNC_TID + lane,
                      begin, end, args) for (rank, begin, end, args), lane in zip(spans, lanes, strict=True)]


def instant_events(events: Sequence[dict[str, Any]], origin_wall: float) -> list[dict[str, Any]]:
    """One "event" instant per event record but start/end and outer syncs (at its emulated time, else wall)."""
    out = []
    for e in events:
        if e["event"] in ("start", "end", "outer_sync"):
            continue
        t = _event_s(e, origin_wall)
        args = {k: v for k, v in e.items() if k not in ("kind", "t_wall")}
        out.append({"name": e["event"], "cat": "event", "ph": "i", "s": "t", "pid": e["rank"], "tid": EVENT_TID,
                    "ts": t * US, "args": args})
    return out


def metadata_events(names: dict[int, str], threads: Iterable[tuple[int, int]]) -> list[dict[str, Any]]:
    """Process names (rank -> label) and a name per (pid, tid) used, so viewers label the tracks."""
    meta: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": label}}
                                  for pid, label in sorted(names.items())]
    meta += [{"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}} for pid in names]
    for pid, tid in sorted(set(threads)):
        if tid >= TRANSFER_TID:
            label = f"transfers {tid - TRANSFER_TID}"
        elif tid >= COLLECTIVE_TID:
            label = f"collectives {tid - COLLECTIVE_TID}"
        elif tid >= SYNC_TID:
            label = f"outer syncs {tid - SYNC_TID}"
        else:
            label = {STEP_TID: "steps", EVENT_TID: "events"}.get(tid, str(tid))
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
    return meta


def build_trace(report: dict[str, Any] | None, steps: Sequence[dict[str, Any]] = (),
                events: Sequence[dict[str, Any]] = (), rank_names: dict[int, str] | None = None) -> dict[str, Any]:
    """The trace of an emulator report (geotrain.emulate.report; None: no links recorded) and of a run's
    metrics `steps` and `events` (geotrain.observe.metrics)."""
    walls = [r["t_wall"] for r in [*steps, *events] if r.get("t_wall") is not None]
    origin = min(walls) if walls else 0.0
    trace = []
    if report is not None:
        trace += transfer_events(report["transfers"]) + collective_events(report["ops"])
    trace += step_events(steps, origin) + sync_events(events, origin) + instant_events(events, origin)
    names = dict(rank_names or {})
    for e in trace:
        names.setdefault(e["pid"], f"rank {e['pid']}")
    if report is not None:
        for part in report.get("ranks", ()):
            names.setdefault(part["rank"], f"rank {part['rank']}")
    other = {"source": "geotrain", "time": "emulated seconds" if report is not None else "wall seconds"}
    if report is not None:
        other.update(cluster=report.get("cluster"), time_scale=report.get("time_scale"))
    return {"traceEvents": metadata_events(names, ((e["pid"], e["tid"]) for e in trace)) + trace,
            "displayTimeUnit": "ms", "otherData": other}


def write_trace(path: Path | str, trace: dict[str, Any]) -> Path:
    path = Path(path)
    path.write_text(json.dumps(trace, separators=(",", ":")))
    return path
