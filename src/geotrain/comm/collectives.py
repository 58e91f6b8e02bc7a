"""The collectives every reducer needs, behind one interface with two implementations.

Code using a `Collective` is written SPMD-style over the *local workers* of this process:
`SimulatedCollective(p)` holds all p workers in one process (local ranks 0..p-1, for experiments
and for checking the distributed code against), `TorchCollective(group)` holds exactly one, this
process's rank in a `torch.distributed` process group (any backend: nothing here is gloo-specific).
Every method takes one tensor per local worker, in `local_ranks` order.

Each collective counts, in its `ledger`, the bytes *one worker* hands to the process group
(see geotrain.comm.ledger); in the simulation all workers hand equal sizes, so one worker's
count is every worker's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from geotrain.comm.gather import GATHER_ALGORITHMS
from geotrain.comm.ledger import CommLedger, tensor_bytes


def all_gather_single(output: torch.Tensor, tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    """torch.distributed's single-tensor all-gather by the name this torch has: `all_gather_single` (torch
    2.13; `all_gather_into_tensor` is deprecated there) or `all_gather_into_tensor` (earlier, e.g. the 2.11
    of GPU images). Looked up at each call, so a ledger that intercepts torch's collectives sees it."""
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, tensor, group=group, async_op=async_op)


class Collective(Protocol):
    world_size: int
    local_ranks: tuple[int, ...]
    ledger: CommLedger

    def all_reduce_mean(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """Element-wise mean over all ranks of one float tensor per local worker (the same result for all)."""
        ...

    def all_reduce_sum(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """Element-wise sum over all ranks, in the tensors' own dtype (fp16 wire buffers are summed in
        fp16); it may reuse and overwrite the inputs."""
        ...

    def all_to_all(self, sends: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each local worker's 1-D send buffer holds world_size equal chunks, chunk j for rank j.
        Returns, per local worker, the buffer of the chunks it received, chunk i from rank i."""
        ...

    def all_gather(self, tensors: Sequence[torch.Tensor], algorithm: str = "ring") -> torch.Tensor:
        """Concatenation (in rank order) of every rank's equal-size 1-D tensor (the same for all);
        `algorithm` "ring" (all_gather) or "direct" (one all-to-all round; geotrain.comm.gather)."""
        ...


class Started:
    """A collective posted and not yet waited for: `wait()` returns its result (what the blocking call
    returns), on `device` (None: where it is). Keeps the posted buffers alive until then."""

    def __init__(self, result: torch.Tensor, work: Any = None, keep: Any = None,
                 device: torch.device | None = None) -> None:
        self._result = result
        self._work = work
        self._keep = keep
        self._device = device

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            self._work.wait()
            self._work = self._keep = None
        return self._result if self._device is None else self._result.to(self._device)


def _check_local(tensors: Sequence[torch.Tensor], count: int, what: str) -> None:
    if len(tensors) != count:
        raise ValueError(f"{what}: expected one tensor per local worker ({count}), got {len(tensors)}")
    sizes = {t.numel() for t in tensors}
    if len(sizes) > 1:
        raise ValueError(f"{what}: all workers must hand equal sizes, got {sorted(sizes)}")


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in GATHER_ALGORITHMS:
        raise ValueError(f"all_gather: algorithm must be one of {', '.join(GATHER_ALGORITHMS)}, got {algorithm!r}")


class SimulatedCollective:
    """p workers in this process. Sums run in rank order, so results are deterministic."""

    def __init__(self, world_size: int) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.local_ranks = tuple(range(world_size))
        self.ledger = CommLedger()

    def all_reduce_mean(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        _check_local(tensors, self.world_size, "all_reduce_mean")
        self.ledger.record("all_reduce", tensor_bytes(tensors[0]), self.world_size)
        total = tensors[0].clone()
        for tensor in tensors[1:]:
            total += tensor
        return total.div_(self.world_size)

    def all_reduce_sum(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        _check_local(tensors, self.world_size, "all_reduce_sum")
        self.ledger.record("all_reduce", tensor_bytes(tensors[0]), self.world_size)
        total = torch.zeros_like(tensors[0])
        for tensor in tensors:  # rank order: deterministic, and what gloo does with two ranks
            total.add_(tensor)
        return total

    def all_to_all(self, sends: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        _check_local(sends, self.world_size, "all_to_all")
        p = self.world_size
        if sends[0].numel() % p:
            raise ValueError(f"all_to_all: send buffer of {sends[0].numel()} elements is not {p} equal chunks")
        self.ledger.record("all_to_all", tensor_bytes(sends[0]), p)
        chunks = [send.view(p, -1) for send in sends]
        return [torch.cat([chunks[src][dst] for src in range(p)]) for dst in range(p)]

    def all_gather(self, tensors: Sequence[torch.Tensor], algorithm: str = "ring") -> torch.Tensor:
        _check_local(tensors, self.world_size, "all_gather")
        _check_algorithm(algorithm)
        self.ledger.record("all_gather", tensor_bytes(tensors[0]), self.world_size)
        return torch.cat(list(tensors))

    def start_all_gather(self, tensors: Sequence[torch.Tensor], algorithm: str = "ring") -> Started:
        """all_gather, posted: here it is done at once."""
        return Started(self.all_gather(tensors, algorithm))

    def start_all_reduce_sum(self, tensors: Sequence[torch.Tensor]) -> Started:
        """all_reduce_sum, posted: here it is done at once."""
        return Started(self.all_reduce_sum(tensors))


class TorchCollective:
    """This process's rank in a torch.distributed process group (default: the world group).

    `wrap(nbytes, run)`: every collective call goes through it (default: `run()`), so that a caller can
    time or emulate it (the runtime's Transport). A group of one rank makes no call at all.
    `host_copies`: hand the group host copies of GPU tensors (gloo beside NCCL, as the runtime's exchanges do on
    CUDA: geotrain.sync.base.host_gradients) and return each result on its input's device."""

    def __init__(self, group: Any = None, wrap: Callable[[int, Callable[[], Any]], Any] | None = None,
                 host_copies: bool = False) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("TorchCollective needs torch.distributed.init_process_group() first")
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.local_ranks = (dist.get_rank(group),)
        self.ledger = CommLedger()
        self._wrap = wrap
        self.host_copies = host_copies

    def _wire(self, tensor: torch.Tensor) -> torch.device:
        """Where `tensor` travels: host memory with host_copies, else its own device."""
        return torch.device("cpu") if self.host_copies else tensor.device

    def _call(self, nbytes: int, run: Callable[[], Any]) -> None:
        call = run if self.world_size > 1 else (lambda: None)
        if self._wrap is None:
            call()
        else:
            self._wrap(nbytes, call)

    def all_reduce_mean(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        import torch.distributed as dist

        _check_local(tensors, 1, "all_reduce_mean")
        total = tensors[0].to(self._wire(tensors[0]), copy=True)
        self.ledger.record("all_reduce", tensor_bytes(total), self.world_size)
        self._call(tensor_bytes(total), lambda: dist.all_reduce(total, group=self.group))
        return total.div_(self.world_size).to(tensors[0].device)

    def all_reduce_sum(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        import torch.distributed as dist

        _check_local(tensors, 1, "all_reduce_sum")
        total = tensors[0].to(self._wire(tensors[0]))
        self.ledger.record("all_reduce", tensor_bytes(total), self.world_size)
        self._call(tensor_bytes(total), lambda: dist.all_reduce(total, group=self.group))
        return total.to(tensors[0].device)

    def all_to_all(self, sends: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        import torch.distributed as dist

        _check_local(sends, 1, "all_to_all")
        send = sends[0].to(self._wire(sends[0])).contiguous()
        if send.numel() % self.world_size:
            raise ValueError(f"all_to_all: send buffer of {send.numel()} elements is not "
                             f"{self.world_size} equal chunks")
        if self.world_size == 1:
            received = send.clone()
        else:
            received = torch.empty_like(send)
        self.ledger.record("all_to_all", tensor_bytes(send), self.world_size)
        self._call(tensor_bytes(send), lambda: dist.all_to_all_single(received, send, group=self.group))
        return [received.to(sends[0].device)]

    def all_gather(self, tensors: Sequence[torch.Tensor], algorithm: str = "ring") -> torch.Tensor:
        _check_local(tensors, 1, "all_gather")
        keep, gathered, post = self._gather(tensors[0].to(self._wire(tensors[0])), algorithm)
        self._call(tensor_bytes(tensors[0]), lambda: post(False))
        return gathered.to(tensors[0].device)

    def _gather(self, tensor: torch.Tensor, algorithm: str) -> tuple[Any, torch.Tensor, Callable[[bool], Any]]:
        """(the buffers to keep alive while posted, the output buffer, post(async_op)) of an all-gather
        by `algorithm`; the ledger counts this rank's piece either way (both send (p - 1) x it:
        geotrain.comm.gather)."""
        import torch.distributed as dist

        _check_algorithm(algorithm)
        mine = tensor.contiguous()
        self.ledger.record("all_gather", tensor_bytes(mine), self.world_size)
        if self.world_size == 1:
            return mine, mine.clone(), lambda async_op: None
        gathered = torch.empty(self.world_size * mine.numel(), dtype=mine.dtype, device=mine.device)
        if algorithm == "direct":  # every peer gets our piece in one all-to-all round
            send = mine.repeat(self.world_size)
            return (mine, send), gathered, lambda async_op: dist.all_to_all_single(
                gathered, send, group=self.group, async_op=async_op)
        return mine, gathered, lambda async_op: all_gather_single(gathered, mine, group=self.group,
                                                                  async_op=async_op)

    # Posted collectives (async work of the group, waited for later: an exchange overlapping compute).
    # They do not go through `wrap`: their time is spent where the caller waits (under geotrain emulate
    # the process group's Work does the timing), and the ledger counts their bytes as the blocking ones.
    def start_all_gather(self, tensors: Sequence[torch.Tensor], algorithm: str = "ring") -> Started:
        """all_gather posted with async_op; `wait()` gives the concatenation in rank order."""
        _check_local(tensors, 1, "start_all_gather")
        keep, gathered, post = self._gather(tensors[0].to(self._wire(tensors[0])), algorithm)
        return Started(gathered, post(True), keep, tensors[0].device)

    def start_all_reduce_sum(self, tensors: Sequence[torch.Tensor]) -> Started:
        """all_reduce_sum posted with async_op; `wait()` gives the sum (in the input buffer)."""
        import torch.distributed as dist

        _check_local(tensors, 1, "start_all_reduce_sum")
        total = tensors[0].to(self._wire(tensors[0]))
        self.ledger.record("all_reduce", tensor_bytes(total), self.world_size)
        if self.world_size == 1:
            return Started(total, device=tensors[0].device)
        return Started(total, dist.all_reduce(total, group=self.group, async_op=True), device=tensors[0].device)
