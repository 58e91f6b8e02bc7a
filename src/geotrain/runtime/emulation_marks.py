"""What the emulating backend saw during one training step of this rank: its clock and its traffic.

`emulation_mark()` at the start of a step and `emulation_span(mark, cluster)` at its end give
{"start_s", "end_s"} (the rank's emulated clock: compute at real speed, link time as emulated) and
{"bytes", "inter_region_bytes"} (payload bytes this rank sent in the step; inter-region: between
devices of different regions). Without the emulating backend both return None.
"""

from __future__ import annotations

from typing import Any

import torch.distributed.distributed_c10d as c10d

from geotrain.cluster import Cluster
from geotrain.emulate import EmulatedProcessGroup

Mark = tuple[float, int]  # (emulated clock s, transfers sent so far)


def _state() -> Any:
    group = c10d._get_default_group() if c10d.is_initialized() else None
    return group.state if isinstance(group, EmulatedProcessGroup) else None


def emulation_mark() -> Mark | None:
    """This rank's emulated clock and sent-transfer count now; None when not emulated."""
    state = _state()
    if state is None:
        return None
    with state.lock:
        return state.clock.now(), len(state.transfers)


def emulation_span(mark: Mark | None, cluster: Cluster) -> dict[str, float] | None:
    """Emulated start/end seconds and bytes sent (all, inter-region) since `mark`; None when not emulated."""
    state = _state()
    if state is None or mark is None:
        return None
    with state.lock:
        end_s, sent = state.clock.now(), state.transfers[mark[1]:]
    region = cluster.region_of
    return {"start_s": mark[0], "end_s": end_s, "bytes": float(sum(t.nbytes for t in sent)),
            "inter_region_bytes": float(sum(t.nbytes for t in sent if region[t.src_device] != region[t.dst_device]))}
