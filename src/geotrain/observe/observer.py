"""The worker's side of a run directory: one `RunObserver` per rank writes its metrics lines and, at the
end, its emulator records (every message it sent and every collective it started) for the trace.

    observer = open_observer(config, rank, emulation)   # NullObserver without config.run.run_dir
    observer.step(record)          # after each training step (the worker's step record)
    observer.event("checkpoint", step, path=..., bytes=..., seconds=...)
    sync.listener = observer       # outer syncs: an "outer_sync" event when each starts and lands
    observer.fail(reason, step)    # on failure: a "failure" event (its "reason"), flush, the emulator records so far
    observer.close()               # at the end: flush, write <run dir>/emulator/rank-<r>.json

The emulator part has the format of `geotrain emulate --report`'s per-rank parts (EmulationState.to_json),
so the trace of a run and of `geotrain emulate --trace` are built by one function (observe.trace).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from geotrain.models import lr_at
from geotrain.observe.metrics import MetricsWriter, _finite, metrics_path, step_metrics

EMULATOR_DIR = "emulator"


class NullObserver:
    """No run directory: every call does nothing."""

    def step(self, record: dict[str, Any]) -> None: ...

    def event(self, name: str, step: int, **fields: Any) -> None: ...

    def sync_started(self, step: int, fragment: int) -> None: ...

    def sync_landed(self, step: int, fragment: int, nbytes: int, started: int) -> None: ...

    def fail(self, reason: str, step: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class RunObserver(NullObserver):
    """Writes one rank's metrics and events under `run_dir` (module doc)."""

    def __init__(self, config: Any, rank: int, emulation: Any, run_dir: Path) -> None:
        self.config = config
        self.rank = rank
        self.emulation = emulation
        self.run_dir = run_dir
        slot = config.layout.slot(rank)
        self.device = slot.device
        self.site = config.cluster.site_of(slot.device)
        self.tokens = config.schedule.batch_size * config.sequence_length
        self.writer = MetricsWriter(metrics_path(run_dir, rank))
        self.cost_s = 0.0  # wall seconds this rank spent in step() and event(): the observer's own cost
        self.steps = 0
        # fail() may come from the watchdog's thread or a signal handler while the main thread writes
        self._lock = threading.RLock()
        self.event("start", 0)
        self.writer.flush()  # on disk at once: a process killed early still shows that it started

    def _emulated_now(self) -> float | None:
        if self.emulation is None:
            return None
        try:
            return float(self.emulation.state().clock.now())
        except Exception:  # noqa: BLE001 - no process group yet (a failure at start-up)
            return None

    def step(self, record: dict[str, Any]) -> None:
        started = time.perf_counter()
        with self._lock:
            self._step(record)
            self.steps += 1
        self.cost_s += time.perf_counter() - started

    def _step(self, record: dict[str, Any]) -> None:
        # the learning rate the worker set (adaptive local steps: by the run's progress, not the rank's own step)
        line = step_metrics(record, site=self.site, device=self.device, lr=record["lr"], tokens=self.tokens,
                            time_scale=self.config.emulation.time_scale, t_wall=time.time())
        self.writer.write(line)

    def event(self, name: str, step: int, **fields: Any) -> None:
        started = time.perf_counter()
        with self._lock:
            self.writer.write({"kind": "event", "event": name, "step": step, "rank": self.rank, "site": self.site,
                               "t_wall": time.time(), "emulated_s": self._emulated_now(), **fields})
        self.cost_s += time.perf_counter() - started

    def sync_started(self, step: int, fragment: int) -> None:
        """An outer sync of `fragment` starts after `step` (geotrain.sync.base.SyncListener)."""
        self.event("outer_sync", step, phase="start", fragment=fragment)

    def sync_landed(self, step: int, fragment: int, nbytes: int, started: int) -> None:
        """The sync of `fragment` started after step `started` lands after `step`, `nbytes` handed."""
        self.event("outer_sync", step, phase="land", fragment=fragment, bytes=nbytes, started=started)

    def fail(self, reason: str, step: int) -> None:
        """A "failure" event at `step` (0-based: the step the rank was in) with `reason` (why the rank ended, one
        line), flushed with every buffered line, and the emulator records so far (the trace). Any thread."""
        with self._lock:
            self.event("failure", step, reason=reason)
            self.writer.flush()
        self._write_emulator_part()

    def flush(self) -> None:
        """Write every buffered line now (a process about to end whose "failure" event someone else writes)."""
        with self._lock:
            self.writer.flush()

    def _write_emulator_part(self) -> None:
        if self.emulation is None:
            return
        try:
            state = self.emulation.state()
        except Exception:  # noqa: BLE001 - no process group yet (a failure at start-up): nothing was sent
            return
        directory = self.run_dir / EMULATOR_DIR
        directory.mkdir(parents=True, exist_ok=True)
        with state.lock:
            state.write_part(directory)

    def close(self) -> None:
        """The "end" event carries this rank's cost: `observer_s` (wall seconds in step/event, the final
        flush included) and `bytes_written` (metrics bytes, this line excluded) over `steps` steps."""
        started = time.perf_counter()
        with self._lock:
            self.writer.flush()
            self.cost_s += time.perf_counter() - started
            self.event("end", -1, steps=self.steps, observer_s=self.cost_s, bytes_written=self.writer.bytes_written)
            self.writer.close()
        self._write_emulator_part()


def open_observer(config: Any, rank: int, emulation: Any) -> NullObserver:
    """The observer of `rank` for config.run.run_dir (a NullObserver when it is None)."""
    run_dir = config.run.run_dir
    return NullObserver() if run_dir is None else RunObserver(config, rank, emulation, Path(run_dir))


class ElasticObserver(RunObserver):
    """One process of an elastic replica group (geotrain.runtime.elastic.group): stage `stage` (shard `shard` of a
    sharded plan) of group `group` writes as the layout's rank of that slot and shard (stage x R + group; x K +
    shard). Its step lines carry the split in wall seconds: `step_s` from the
    previous step's end (quorums, recoveries and retries included), `compute_s` (forward, backward, optimizer),
    `comm_s` (the exchange's all-reduces and commits), `wait_s` the rest (>= 0: mostly quorums); `bytes_dp`;
    with emulated links `bytes_intra` / `bytes_inter` (what the group sent inside / between regions, else
    null), `synced` and `emulated_end_s`. Events: `start` (`restart` for a restarted group, with its
    incarnation), `resume`, `rejoin` (a live recovery, its seconds), `outer_sync`, `checkpoint`, `end`; a
    killed group's `failure` is written by the launcher (`launcher_event`)."""

    def __init__(self, config: Any, group: int, stage: int, incarnation: int, run_dir: Path, shard: int = 0) -> None:
        self.incarnation = incarnation
        super().__init__(config, config.layout.rank_of(stage, group, shard), None, run_dir)

    def event(self, name: str, step: int, **fields: Any) -> None:
        if name == "start" and self.incarnation:
            name, fields = "restart", {**fields, "incarnation": self.incarnation}
        super().event(name, step, **fields)

    def _step(self, record: dict[str, Any]) -> None:
        cfg = self.config
        slot = cfg.layout.slot(self.rank)
        step_s, compute_s, comm_s = float(record["wall_s"]), float(record["compute_s"]), float(record["comm_s"])
        sent, inter = record.get("sent_bytes"), record.get("inter_region_bytes")
        self.writer.write({
            "kind": "step", "step": record["step"], "rank": self.rank, "stage": slot.stage, "replica": slot.replica,
            "device": self.device, "site": self.site, "t_wall": time.time(), "loss": _finite(record["loss"]),
            "lr": lr_at(record["step"], cfg.run.steps, cfg.optim.lr), "tokens": self.tokens,
            "step_s": step_s, "compute_s": compute_s, "comm_s": comm_s,
            "wait_s": max(0.0, step_s - compute_s - comm_s), "bytes_intra": None if sent is None else sent - inter,
            "bytes_inter": inter, "bytes_dp": int(record["dp_bytes"]), "synced": bool(record["synced"]),
            "emulated_start_s": None, "emulated_end_s": record.get("emulated_s")})


def open_elastic_observer(config: Any, group: int, stage: int, incarnation: int, shard: int = 0) -> NullObserver:
    """The observer of an elastic group's process for config.run.run_dir (a NullObserver when it is None)."""
    run_dir = config.run.run_dir
    return NullObserver() if run_dir is None else ElasticObserver(config, group, stage, incarnation, Path(run_dir),
                                                                  shard)


def launcher_event(config: Any, rank: int, name: str, step: int, **fields: Any) -> None:
    """Append one event line to `rank`'s metrics file for config.run.run_dir (nothing without one), written by
    a launcher about a rank that cannot write it (its process was killed or crashed). One whole line in one
    write: the rank's restarted process appends to the same file only after this returns."""
    if config.run.run_dir is None:
        return
    site = config.cluster.site_of(config.layout.slot(rank).device)
    writer = MetricsWriter(metrics_path(config.run.run_dir, rank))
    writer.write({"kind": "event", "event": name, "step": step, "rank": rank, "site": site, "t_wall": time.time(),
                  "emulated_s": None, **fields})
    writer.close()
