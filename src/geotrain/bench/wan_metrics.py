"""What `bench wan` derives from a row's per-step records: its emulated seconds per step, how far it is
from the benchmark's physical limit, how busy its devices are, and the bandwidth it demands.

- `emulated_step_seconds`: the slowest rank's seconds per step on the emulated clock (`step_bounds`).
- `zero_cost_links(cluster)`: the cluster with every link free (MAX_GBPS, 0 ms). The limit row trains
  the fp32 baseline on it through the same emulating backend and compute clock as every other row, so
  its time is the same compute with communication free (a `--time-scale 0` run would leave the
  emulator and time compute in wall seconds of this shared machine instead).
- `limit_fraction`: a row's time to target / the limit row's (1 = the limit; None if either missed).
- `compute_fraction`: per device, compute seconds (the runtime's ComputeTimer: forward, backward, codec
  and optimizer work, counted by the emulated clock's own clock: CPU seconds under `--compute-clock
  cpu`) over the row's emulated seconds, steps after the first (as the step times are), at most 1; the
  mean over devices. The rest of a step's CPU time (the schedule's bookkeeping, batches, gloo's
  threads) is not compute, so even the limit row reads a little under 1.
- `peak_inter_region_gbps`: the highest inter-region rate demanded in any window of `window_s` (1 s;
  the whole run if shorter). Each inter-region message's bytes (all ranks) count while it occupies its
  link: from its start to its last byte leaving (the emulator's `wire_end_s`, recorded per step as
  `inter_region_wire`), placed on the row's timeline (each step's span on the emulated clock mapped onto
  its emulated seconds, the time between steps left out); a record without them (an older geotrain's)
  spreads its step's bytes over the step. `peak_profile`: the same at several windows (PEAK_WINDOWS_S):
  a window shorter than a sync's burst sees the links' own rate, one spanning several syncs the mean.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import numpy as np

from geotrain.cluster import Cluster
from geotrain.bench.wan_rows import WanBenchError
from geotrain.cluster.model import MAX_GBPS
from geotrain.emulate.traffic import PEAK_WINDOWS_S, peak_profile as traffic_peak_profile


def zero_cost_links(cluster: Cluster) -> Cluster:
    """`cluster` with every link at MAX_GBPS and 0 ms (its devices, regions and GPUs unchanged)."""
    n = cluster.n_devices
    return dataclasses.replace(cluster, name=f"{cluster.name}-free-links", bandwidth_gbps=np.full((n, n), MAX_GBPS),
                               latency_ms=np.zeros((n, n)), nic_gbps=None)


def limit_fraction(time_to_target_s: float | None, limit_s: float | None) -> float | None:
    """Time to target as a multiple of the limit row's (None when either row missed the target)."""
    if time_to_target_s is None or not limit_s:
        return None
    return time_to_target_s / limit_s


def _steady(steps: int) -> slice:
    """The steps the step times summarise: all but the first (its one-off costs), or the only one."""
    return slice(1, None) if steps > 1 else slice(None)


def compute_fraction(records: list[dict[str, Any]], step_seconds: np.ndarray) -> float:
    """Mean over ranks of min(1, compute seconds / emulated seconds) over the steady steps (module doc).
    `step_seconds`: (steps,) the row's emulated seconds per step (bench.wan.emulated_step_seconds)."""
    steps = len(step_seconds)
    wall = float(np.sum(step_seconds[_steady(steps)]))
    compute: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(steps))
    for record in records:
        compute[record["rank"]][record["step"]] = record["compute_s"]
    if wall <= 0 or not compute:
        return 0.0
    return float(np.mean([min(1.0, float(np.sum(c[_steady(steps)])) / wall) for c in compute.values()]))


def step_bounds(records: list[dict[str, Any]], steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps,) emulated clock seconds each step begins and ends: the slowest rank's end, and the later of the
    previous step's end and the slowest rank's start (time between steps, checkpoints, left out)."""
    start, end = np.zeros(steps), np.zeros(steps)
    for record in records:
        span = record["emulated"]
        if span is None:
            raise WanBenchError("the run was not emulated (time scale 0?): no emulated clock in its records")
        start[record["step"]] = max(start[record["step"]], span["start_s"])
        end[record["step"]] = max(end[record["step"]], span["end_s"])
    return np.maximum(np.concatenate([[0.0], end[:-1]]), start), end


def emulated_step_seconds(records: list[dict[str, Any]], steps: int) -> np.ndarray:
    """(steps,) emulated seconds of each step (step_bounds: end - begin). Step 0 counts as the mean of the
    others (its one-off start-up costs, codec kernels compiled and buffers allocated, are not training time)."""
    begin, end = step_bounds(records, steps)
    seconds = end - begin
    if steps > 1:
        seconds[0] = float(np.mean(seconds[1:]))
    return seconds


def inter_region_wire_on_timeline(records: list[dict[str, Any]], step_seconds: np.ndarray
                                  ) -> tuple[np.ndarray, tuple[float, float]]:
    """((n, 3) rows [start, end, bytes] of every inter-region message on the row's timeline, the timeline's
    (start, end)): each message's time on its link (module doc), in seconds from the row's start.
    `step_seconds`: (steps,) the row's emulated seconds per step (emulated_step_seconds)."""
    steps = len(step_seconds)
    begin, end = step_bounds(records, steps)
    edges = np.concatenate([[0.0], np.cumsum(step_seconds)])
    clock = np.maximum.accumulate(np.column_stack([begin, end]).ravel())
    timeline = np.column_stack([edges[:-1], edges[1:]]).ravel()
    spans = []  # [clock start, clock end, bytes]
    for record in records:
        span = record["emulated"]
        if "inter_region_wire" in span:
            spans.extend(span["inter_region_wire"])
        elif span["inter_region_bytes"]:
            spans.append([begin[record["step"]], end[record["step"]], span["inter_region_bytes"]])
    wire = np.asarray(spans, dtype=float).reshape(-1, 3)
    placed = np.column_stack([np.interp(wire[:, 0], clock, timeline), np.interp(wire[:, 1], clock, timeline),
                              wire[:, 2]])
    return placed, (0.0, float(edges[-1]))


def peak_inter_region_gbps(records: list[dict[str, Any]], step_seconds: np.ndarray, window_s: float = 1.0) -> float:
    """Highest mean inter-region rate (Gbit/s) over any `window_s` of the row's timeline (module doc)."""
    return peak_profile(records, step_seconds, (window_s,))[float(window_s)]


def peak_profile(records: list[dict[str, Any]], step_seconds: np.ndarray,
                 windows_s: tuple[float, ...] = PEAK_WINDOWS_S) -> dict[float, float]:
    """{window (s): peak_inter_region_gbps at that window} (module doc; emulate.traffic.peak_profile)."""
    return traffic_peak_profile(*inter_region_wire_on_timeline(records, step_seconds), windows_s)
