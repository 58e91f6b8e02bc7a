"""A replica group that comes back after the launch's last outer sync was committed: its links healed (a partition)
or it restarted between the last sync of the groups that finished and their exit.

Its first quorum has no live peer to recover from (the finished groups' Managers are stopped: their heartbeats end,
and the Lighthouse forms this group's quorum alone once they time out), so torchft hands it no state and it would
train the rest of the run alone from its stale copy: two models at the end (a split brain; measured with adaptive
local steps, whose survivor runs the periods the cut group misses at its own fast pace and finished within the 2 s
of the cut in 2 of 2 runs). Instead: a quorum that healed nothing (`GroupState.healed` False) after the launch's
last step was committed by some group (the launcher's store key commit/<end - 1>) ends the group's loop
(`RunEnded`), and the group takes the final parameters a finished peer wrote (same group rank, `take_final`), as a
live recovery at the end would hand them; its records stop where it was cut. No finished peer's parameters within
the wait: it ends without a summary (it missed the end, as a group still cut when the first group finishes, which
the launcher stops).

    if not healed and run_ended(store, end): raise RunEnded(...)      # in the group's quorum
    peer = take_final(params, result_dir, group, rank, replicas, timeout_s)   # its summary: steps, val_loss
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from geotrain.optim.shards import local_shard
from geotrain.runtime.elastic.summary import params_path, summary_path

POLL_S = 0.05
"""How often a late group looks for a finished peer's final parameters (seconds)."""


class RunEnded(Exception):  # noqa: N818 - a control-flow signal, not an error
    """This group's quorum came after the launch's last committed step: it takes a finished peer's final state."""


def run_ended(store: object, end: int) -> bool:
    """Whether some group committed step `end` - 1 (the launch's last) in the launcher's `store`."""
    return bool(store.check([f"commit/{end - 1}"]))  # type: ignore[attr-defined]


def take_final(params: Sequence[torch.nn.Parameter], result_dir: Path, group: int, rank: int, replicas: int,
               timeout_s: float) -> dict[str, Any] | None:
    """Load into `params` the final parameters of the first other group whose group rank `rank` has finished in
    `result_dir` (its summary written after its parameters), waiting at most `timeout_s` seconds; its summary (steps,
    val_loss: of these same parameters), or None when none finished in time (`params` untouched)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for peer in (g for g in range(replicas) if g != group):
            summary = summary_path(result_dir, peer, rank)
            if summary.is_file():
                load_flat(params, torch.load(params_path(result_dir, peer, rank), weights_only=True))
                return json.loads(summary.read_text())
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


def load_flat(params: Sequence[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Copy `flat` (the parameters' local shards, concatenated in order, as a group writes them) into `params`."""
    locals_ = [local_shard(p) for p in params]
    size = sum(local.numel() for local in locals_)
    if size != flat.numel():
        raise ValueError(f"final parameters of {flat.numel()} values for a model of {size}")
    offset = 0
    with torch.no_grad():
        for local in locals_:
            local.copy_(flat[offset:offset + local.numel()].view_as(local))
            offset += local.numel()
