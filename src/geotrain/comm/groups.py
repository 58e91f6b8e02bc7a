"""Process groups bounded by the run's collective timeout: `new_group(ranks, timeout_s)`.

torch's `new_group` without `timeout=` gives the group torch's default (30 minutes on gloo), not the timeout
the world group got from `init_process_group`: a rank that is stuck but alive (it keeps its heartbeat) then
holds its peers for half an hour. Checked on torch 2.13, 2 processes, a 5 s world timeout, the peer 14 s
late: a new group's all_reduce waited the 14 s without `timeout=`, and raised after 3.0 s with a 3 s group
timeout; the same for broadcast, recv and barrier, on gloo and on the emulating backend (geotrain.emulate,
whose groups wrap a gloo group made with the options' timeout). Every group geotrain creates goes through
here, so the run's `--comm-timeout` (reliability.comm_timeout_s) bounds every collective and p2p transfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist


def collective_timeout(timeout_s: float | None) -> timedelta | None:
    """`timeout_s` seconds as torch wants a timeout (None stays None: torch's default)."""
    return None if timeout_s is None else timedelta(seconds=timeout_s)


def new_group(ranks: Sequence[int] | None, timeout_s: float | None, backend: str | None = None) -> Any:
    """`dist.new_group(ranks)` (None: the whole world) whose collectives wait at most `timeout_s` seconds for a
    peer, then raise; None: torch's default (30 minutes), for library callers outside a run that give none.
    Every rank of the default group calls it, in the same order (torch's new_group rule)."""
    return dist.new_group(None if ranks is None else list(ranks), timeout=collective_timeout(timeout_s),
                          backend=backend)
