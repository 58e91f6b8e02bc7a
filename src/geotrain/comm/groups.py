"""Process groups bounded by the run's collective timeout: `new_group(ranks, timeout_s)`.

torch's `new_group` without `timeout=` gives the group torch's default (30 minutes on gloo), not the timeout
the world group got from `init_process_group`: a rank that is stuck but alive (it keeps its heartbeat) then
holds its peers for half an hour. Checked on torch 2.13, 2 processes, a 5 s world timeout, the peer 14 s
late: a new group's all_reduce waited the 14 s without `timeout=`, and raised after 3.0 s with a 3 s group
timeout; the same for broadcast, recv and barrier, on gloo and on the emulating backend (geotrain.emulate,
whose groups wrap a gloo group made with the options' timeout). Every group geotrain creates goes through
here, so the run's `--comm-timeout` (reliability.comm_timeout_s) bounds every collective and p2p transfer.

Which backend a run's group uses is decided here too (`group_backend`): on CUDA, NCCL alone for the dimensions
inside one site (a sharded slot's FSDP2 group, a pipeline inside a site), the per-device string (gloo for host
tensors, NCCL for GPU ones) for the world and for what crosses sites. Not yet run on a GPU (benchmarks/cuda/check.sh
is the check to run there). An elastic run's torchft group follows the same rule (`torchft_backend`).
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


PER_DEVICE_BACKEND = "cpu:gloo,cuda:nccl"
"""torch's per-device backend string: host tensors on gloo, GPU tensors on NCCL."""

GROUP_DIMENSIONS = ("world", "replicate", "shard", "pipeline", "replica")
"""What a group of a run spans: every rank; the same slot (or shard) of each replica (the data-parallel / outer
sync group, across sites); the K shards of one slot (FSDP2); one replica's stages (and its tied weights); every rank
of one replica, its stages and shards (where adaptive local steps agree on host tensors)."""


def group_backend(device_type: str, dimension: str, sites: int) -> str | None:
    """The torch.distributed backend of a group of `dimension` (GROUP_DIMENSIONS) whose ranks' devices are in
    `sites` sites, for a run on `device_type` ("cpu" or "cuda"): the one rule every group of a run follows.

    CPU: None, the world's backend (gloo, or the link emulator's). CUDA: the world is the per-device string; a
    shard or pipeline group inside one site is NCCL alone (GPU tensors only: FSDP2's all-gathers and
    reduce-scatters, activations); the replicate dimension, and any group across sites, is the per-device string
    (the outer sync's exchanges encode host copies on gloo: geotrain.sync.base.host_gradients; a pipeline's GPU
    activations across sites ride NCCL)."""
    if dimension not in GROUP_DIMENSIONS:
        raise ValueError(f"group dimension must be one of {', '.join(GROUP_DIMENSIONS)}, got {dimension!r}")
    if device_type != "cuda":
        return "gloo" if dimension == "world" else None
    if dimension in ("shard", "pipeline") and sites == 1:
        return "nccl"
    return PER_DEVICE_BACKEND


def torchft_backend(device_type: str, sites: int) -> str:
    """The backend of an elastic run's torchft process group (torchft's ProcessGroupGloo or ProcessGroupNCCL: one
    backend per group), which carries the replicate dimension between replica groups in `sites` sites: what
    `group_backend` gives that dimension, where the per-device string (a run on CUDA) means the exchanges' host
    copies on gloo (geotrain.sync.base.host_gradients), as in a non-elastic run."""
    backend = group_backend(device_type, "replicate", sites)
    return "gloo" if backend in (None, PER_DEVICE_BACKEND) else backend
