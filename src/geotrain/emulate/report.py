"""The emulation report: every transfer (bytes, devices, emulated start/end) and every collective, as JSON.

    {"cluster": name, "devices": [...], "time_scale": F,
     "ranks": [{"rank", "device", "clock_s", "slept_s"}...],
     "transfers": [{"op", "seq", "src_device", "dst_device", "src_rank", "dst_rank", "nbytes",
                    "start_s", "end_s", "wire_end_s"}...],   (sorted by start; each message once, from its sender)
     "ops": [{"op", "seq", "group", "ranks", "nbytes", "start_s", "end_s"}...],
     "summary": {"transfers", "bytes", "inter_region_bytes", "emulated_end_s",
                 "peak_inter_region_gbps_by_window": {"0.01": Gbit/s, ..., "1": Gbit/s}}}
Times are emulated seconds since each rank created its process group. The peaks: the highest mean rate
of the messages between regions over any window of that many seconds, each message's bytes counted
while it is on its link (geotrain.emulate.traffic).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from geotrain.cluster import Cluster
from geotrain.emulate.traffic import peak_profile, profile_json


def merge_report(parts_dir: Path, cluster: Cluster, devices: Sequence[int], time_scale: float) -> dict[str, Any]:
    """Merge the ranks' `rank-<r>.json` parts (ranks that wrote none are simply absent)."""
    parts = [json.loads(p.read_text()) for p in sorted(Path(parts_dir).glob("rank-*.json"))]
    parts.sort(key=lambda part: part["rank"])
    transfers = sorted((t for part in parts for t in part["transfers"]), key=lambda t: (t["start_s"], t["src_rank"]))
    ops = sorted((o for part in parts for o in part["ops"]), key=lambda o: (o["start_s"], o["group"], o["seq"]))
    region = cluster.region_of
    between = [t for t in transfers if region[t["src_device"]] != region[t["dst_device"]]]
    inter = sum(t["nbytes"] for t in between)
    peaks = peak_profile(np.array([[t["start_s"], t["wire_end_s"], t["nbytes"]] for t in between]).reshape(-1, 3))
    return {
        "cluster": cluster.name, "devices": list(devices), "time_scale": time_scale,
        "ranks": [{k: part.get(k) for k in ("rank", "device", "clock_s", "slept_s", "compute_scale")}
                  for part in parts],
        "transfers": transfers, "ops": ops,
        "summary": {"transfers": len(transfers), "bytes": sum(t["nbytes"] for t in transfers),
                    "inter_region_bytes": inter,
                    "emulated_end_s": max((part["clock_s"] for part in parts), default=0.0),
                    "peak_inter_region_gbps_by_window": profile_json(peaks)},
    }


def barrier_intervals_s(report: dict[str, Any], group: str = "0") -> list[float]:
    """Emulated seconds between consecutive barriers of `group` (the default group is "0"): the
    emulated step times of a script that ends each step with `dist.barrier()`."""
    ends = [o["end_s"] for o in report["ops"] if o["op"] == "barrier" and o["group"] == group]
    return [b - a for a, b in zip(ends, ends[1:])]
