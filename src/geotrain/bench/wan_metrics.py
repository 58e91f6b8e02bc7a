"""What `bench wan` derives from a row's per-step records besides time to target: how far a row is from
the benchmark's physical limit, how busy its devices are, and the bandwidth it demands.

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
- `peak_inter_region_gbps`: the records carry per-step inter-region bytes, not per-transfer times of
  the DP collectives, so each step's bytes (all ranks) are spread evenly over that step's emulated
  seconds on the row's timeline; the peak is the highest mean rate over any window of `window_s`
  (1 s; the whole run if shorter).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cluster.model import MAX_GBPS


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


def peak_inter_region_gbps(records: list[dict[str, Any]], step_seconds: np.ndarray, window_s: float = 1.0) -> float:
    """Highest mean inter-region rate (Gbit/s) over any `window_s` of the row's emulated timeline, each
    step's inter-region bytes (all ranks) spread evenly over its seconds (module doc)."""
    steps = len(step_seconds)
    nbytes = np.zeros(steps)
    for record in records:
        nbytes[record["step"]] += record["emulated"]["inter_region_bytes"]
    edges = np.concatenate([[0.0], np.cumsum(step_seconds)])
    total_s = float(edges[-1])
    if total_s <= 0:
        return 0.0
    cumulative = np.concatenate([[0.0], np.cumsum(nbytes)])  # bytes carried by each step edge: linear between
    window = min(window_s, total_s)
    # the best window of a piecewise-constant rate has an edge at a step boundary
    starts = np.clip(np.concatenate([edges, edges - window]), 0.0, total_s - window)
    carried = np.interp(starts + window, edges, cumulative) - np.interp(starts, edges, cumulative)
    return float(carried.max() * 8 / 1e9 / window)
