"""A run directory's life around a launch: `start_run` before the workers start (its run.json), and
`finish_run` after they end, well or not (trace.json and TensorBoard files from what the ranks wrote).

    <run dir>/run.json              plan, cluster, sites, layout (rank -> stage, replica, device, site)
    <run dir>/metrics/rank-<r>.jsonl  per-step records and events (geotrain.observe.metrics)
    <run dir>/emulator/rank-<r>.json  each rank's emulator records (written at its end; with emulation)
    <run dir>/trace.json            Chrome trace (geotrain.observe.trace)
    <run dir>/tensorboard/          TensorBoard scalars (geotrain.observe.tensorboard; with the extra)
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from geotrain.emulate.report import merge_report
from geotrain.observe.lines import load_lines
from geotrain.observe.observer import EMULATOR_DIR
from geotrain.observe.rundir import prepare_run_dir, read_about
from geotrain.observe.tensorboard import TensorBoardMissing, write_scalars
from geotrain.observe.trace import build_trace, write_trace

TRACE_FILE = "trace.json"


def describe_ranks(config: Any) -> list[dict[str, Any]]:
    """Per rank: its stage, replica, device, device name and site (region name)."""
    cluster, layout = config.cluster, config.layout
    ranks = []
    for rank in range(config.world_size):
        slot = layout.slot(rank)
        ranks.append({"rank": rank, "stage": slot.stage, "replica": slot.replica, "device": slot.device,
                      "device_name": cluster.device_names[slot.device],
                      "site": cluster.site_of(slot.device),
                      "gpu": cluster.gpus[slot.device]})
    return ranks


def start_run(config: Any) -> Path:
    """Prepare config.run.run_dir and write its run.json."""
    about = {"plan": config.plan_name, "cluster": config.cluster.name, "stages": config.stages,
             "replicas": config.replicas, "steps": config.run.steps, "time_scale": config.emulation.time_scale,
             "sync_every": config.optim.sync_every, "started_unix_s": time.time(), "ranks": describe_ranks(config)}
    return prepare_run_dir(config.run.run_dir, about)


def rank_labels(about: dict[str, Any]) -> dict[int, str]:
    """Trace process names from run.json's ranks ("rank 3 tokyo (stage 1, replica 1, tokyo-0)"); an entry it
    cannot read is left out (the trace then names that rank by number)."""
    labels = {}
    for r in about.get("ranks", []) if isinstance(about.get("ranks"), list) else []:
        try:
            labels[int(r["rank"])] = (f"rank {r['rank']} {r['site']} (stage {r['stage']}, replica {r['replica']}, "
                                      f"{r['device_name']})")
        except (TypeError, KeyError, ValueError, OverflowError):  # OverflowError: a rank of Infinity
            continue
    return labels


def _emulator_report(run_dir: Path, config: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The merged emulator records of the run (None without emulation), and a note where they are unreadable."""
    parts = run_dir / EMULATOR_DIR
    if not parts.is_dir() or not any(parts.glob("rank-*.json")):
        return None, None
    devices = [config.layout.slot(r).device for r in range(config.world_size)]
    try:
        return merge_report(parts, config.cluster, devices, config.emulation.time_scale), None
    except Exception as exc:  # noqa: BLE001 - a damaged part costs the trace its transfers, not the trace
        return None, f"{EMULATOR_DIR}/: unreadable ({type(exc).__name__}), the trace has no transfers"


def finish_run(run_dir: Path | str, config: Any) -> dict[str, Any]:
    """Write trace.json (and TensorBoard files when the package is installed) from what the ranks left, their
    unreadable lines skipped (geotrain.observe.lines); returns {"trace": path, "tensorboard": path or None,
    "steps": records, "events": records, "skipped_lines": count, "notes": [what was skipped or left out]}."""
    run_dir = Path(run_dir)
    lines = load_lines(run_dir)
    steps, events = lines.steps, lines.events
    report, emulator_note = _emulator_report(run_dir, config)
    about, _ = read_about(run_dir)
    trace = write_trace(run_dir / TRACE_FILE, build_trace(report, steps, events, rank_labels(about)))
    try:
        board = write_scalars(run_dir, steps) if steps else None
    except TensorBoardMissing:
        board = None
    return {"trace": trace, "tensorboard": board, "steps": len(steps), "events": len(events),
            "skipped_lines": lines.skipped, "notes": [*lines.notes, *([emulator_note] if emulator_note else [])]}


def row_run_dir(parent: Path | str, label: str) -> str:
    """A bench row's run directory under `parent`: its label made a folder name (lower case, dashes)."""
    return str(Path(parent) / (re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:60] or "row"))


@contextmanager
def recording(config: Any) -> Iterator[None]:
    """Around a library launch (the benches): `start_run` before and `finish_run` after, also when the launch
    fails, where config.run.run_dir is set; nothing otherwise."""
    if config.run.run_dir is None:
        yield
        return
    start_run(config)
    try:
        yield
    finally:
        finish_run(config.run.run_dir, config)
