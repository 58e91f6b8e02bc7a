"""Per-step metrics of every rank as JSON Lines: one file per rank, one record per line.

    <run dir>/metrics/rank-<r>.jsonl
    {"kind": "step", "step", "rank", "stage", "replica", "device", "site", "t_wall", "loss", "lr", "tokens",
     "step_s", "compute_s", "comm_s", "wait_s", "bytes_intra", "bytes_inter", "bytes_dp", "bytes_pp",
     "grad_norm", "val_loss", "emulated_start_s", "emulated_end_s", "progress_step", "global_updates"}
    {"kind": "event", "event", "step", "rank", "site", "t_wall", "emulated_s", ...more by event}

Events ("step": the 0-based step after which it happened, or the step a run starts or resumes at):
  start / end          - a rank's process begins / ends (end: `steps`, `observer_s`, `bytes_written`);
  restart              - an elastic group's restarted process begins (`incarnation`: its restart count);
  resume / replan      - a run continues from a checkpoint; on another layout also `replan` (`from_replicas`,
                         `to_replicas`, `from_assignment`, `to_assignment`: runtime.replan.layout_change);
  outer_sync           - `phase` "start" or "land" of one outer sync of `fragment` (0 without fragments); a
                         landing adds `bytes` (handed to its collectives) and `started` (the step it started
                         after): blocking syncs start and land after one step, delayed ones `--sync-delay` later;
  checkpoint           - this rank's shard written: `path`, `bytes`, `seconds` (wall, the save's barrier included);
  failure              - the rank failed (`message`), written by the rank, or by the elastic launcher for a
                         group's killed or crashed process (`exit`, and `restart`: the restart it gets, or null);
  rejoin               - an elastic group recovered a live peer's state (`seconds`).

The step time splits three ways, every part measured by the worker (geotrain.runtime.worker):
  step_s    - the step's span: on the emulated clock with link emulation (emulated seconds: compute at the
              emulated device's speed, links as emulated), else wall seconds;
  compute_s - forward, backward, codecs and optimizer (the worker's ComputeTimer, same clock);
  comm_s    - exposed communication: the data-parallel collectives, from the latest member's start to the end
              (the transport's records; emulated seconds / time scale under emulation), and an asynchronous
              outer sync's exchange with its server (request out to reply in: `exchange_s` of the worker's
              record), at most the step's time outside compute (a sync posted in one step and landed steps
              later overlaps their compute: only what the steps did not cover is exposed);
  wait_s    - step_s - compute_s - comm_s (>= 0): blocked on pipeline messages and on slower peers (a DP
              collective starts when its last member arrives), plus untimed host work (batch slicing).
bytes_intra / bytes_inter: payload bytes this rank sent inside its region / to other regions (the emulator's
records of every message it sent: pipeline and collectives; None without emulation). bytes_dp / bytes_pp: the
payload handed to DP collectives and the activations sent down the pipeline (known with or without emulation).
tokens: the tokens of this replica's batch (batch_size x sequence length); `t_wall`: Unix seconds at the end.
lr: the learning rate the worker set for the step. progress_step: the run's progress at the step, a 0-based step of
the equal schedule (R replicas x one inner step each): the rank's own step in lock-step runs; with adaptive local
steps the rank's place in its period; with asynchronous outer updates the global model's replica updates it
started from x H / R. global_updates: asynchronous runs only (else null), the updates of the global model the rank
holds after the step. The last step's line of an adaptive or asynchronous run includes the run's end (the last
landing, the final exchange: on rank 0 the server's replies to the others).

Lines are buffered and written whole (`MetricsWriter`), flushed every FLUSH_EVERY_S or FLUSH_RECORDS
records, at the end and on failure: a killed run leaves complete lines up to its last flush.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

METRICS_DIR = "metrics"
FLUSH_EVERY_S = 2.0
FLUSH_RECORDS = 256


def metrics_path(run_dir: Path | str, rank: int) -> Path:
    return Path(run_dir) / METRICS_DIR / f"rank-{rank}.jsonl"


class MetricsWriter:
    """Appends JSON records to one file, a line each, buffered (see the module doc)."""

    def __init__(self, path: Path, clock: Any = time.monotonic) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[str] | None = path.open("a", encoding="utf-8")
        self._lines: list[str] = []
        self._clock = clock
        self._flushed_at = clock()
        self.bytes_written = 0

    def write(self, record: dict[str, Any]) -> None:
        self._lines.append(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
        if len(self._lines) >= FLUSH_RECORDS or self._clock() - self._flushed_at >= FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self._file is None:
            return
        if self._lines:
            text = "".join(self._lines)
            self._file.write(text)
            self.bytes_written += len(text.encode())
            self._lines.clear()
        self._file.flush()
        self._flushed_at = self._clock()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


def _finite(value: Any) -> float | None:
    """A float for JSON, None for missing or not finite values (a diverged loss reads null, not NaN)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def step_metrics(record: dict[str, Any], *, site: str, device: int, lr: float, tokens: int, time_scale: float,
                 t_wall: float) -> dict[str, Any]:
    """A metrics line from one worker step record (geotrain.runtime.worker.Worker.train_step)."""
    span = record.get("emulated")
    collective_s = float(record["dp_emulated_s"])
    exchange_s = float(record.get("exchange_s", 0.0))  # an asynchronous outer sync's, on the step's own clock
    if span is not None:
        step_s = span["end_s"] - span["start_s"]
        comm_s = (collective_s / time_scale if time_scale > 0 else collective_s) + exchange_s
        inter = float(span["inter_region_bytes"])
        bytes_intra, bytes_inter = float(span["bytes"]) - inter, inter
    else:
        step_s, comm_s = float(record["iteration_s"]), float(record["dp_s"]) + exchange_s
        bytes_intra = bytes_inter = None
    compute_s = float(record["compute_s"])
    comm_s = min(comm_s, max(0.0, step_s - compute_s))
    return {"kind": "step", "step": record["step"], "rank": record["rank"], "stage": record["stage"],
            "replica": record["replica"], "device": device, "site": site, "t_wall": t_wall,
            "loss": _finite(record["loss"]), "lr": lr, "tokens": tokens, "step_s": step_s,
            "compute_s": compute_s, "comm_s": comm_s, "wait_s": max(0.0, step_s - compute_s - comm_s),
            "bytes_intra": bytes_intra, "bytes_inter": bytes_inter, "bytes_dp": int(record["dp_bytes"]),
            "bytes_pp": int(record.get("pp_bytes", 0)), "grad_norm": _finite(record.get("grad_norm")),
            "val_loss": _finite(record.get("val_loss")),
            "emulated_start_s": None if span is None else span["start_s"],
            "emulated_end_s": None if span is None else span["end_s"],
            "progress_step": int(record.get("progress_step", record["step"])),
            "global_updates": record.get("global_updates")}


def read_metrics(run_dir: Path | str) -> list[dict[str, Any]]:
    """Every readable record of a run directory's metrics files (all ranks; unreadable lines skipped:
    geotrain.observe.lines, which also counts them)."""
    from geotrain.observe.lines import load_lines  # it reads this module's METRICS_DIR

    return list(load_lines(run_dir).records)


def steps_of(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == "step"]


def events_of(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == "event"]
