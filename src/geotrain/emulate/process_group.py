"""The emulating process group: gloo does the real exchange, the cluster's links set the time.

Every collective also all-gathers each member's emulated clock at issue (and, for all-to-all, what it
sends to whom); at `wait()` all members therefore compute the same schedule: the operation starts at the
latest member's clock (and not before the group's previous collective ended: one at a time per group, as
one communicator), its rounds of messages are timed by schedule.run_rounds with the algorithm of
algorithms.py, and every member's clock advances (scaled sleep) to the end. Point-to-point messages carry
the sender's emulated start and arrival in a 16-byte header posted with the payload as ONE message (a
receive posted in two parts can deadlock a pipeline schedule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from geotrain.emulate import algorithms
from geotrain.emulate.schedule import Message, Transfer, run_rounds
from geotrain.emulate.state import EmulationState, OpRecord
from geotrain.emulate.work import EmulatedWork

BACKEND_NAME = "geotrain_emulate"
HEADER_BYTES = 16  # two float64: emulated start and arrival of a point-to-point message
Rounds = list[list[Message]]


def tensor_bytes(tensors: Sequence[torch.Tensor]) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors))


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(-1).view(torch.uint8)


def _check_p2p(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """gloo's checks on a point-to-point tensor, with its messages: gloo itself only sees our header +
    payload copy, so until the conformance test a strided tensor was sent (or received) where gloo refuses."""
    if len(tensors) != 1:
        raise RuntimeError("requires a single-element tensor list")
    if not tensors[0].is_contiguous():
        raise RuntimeError("input tensor has to be contiguous")
    if tensors[0].is_sparse:
        raise RuntimeError("input tensor has to be dense")
    return tensors[0]


@dataclass
class _Pending:
    """An issued collective: its real works, the members' stamps, how to build its rounds."""

    op: str
    seq: int
    nbytes: float
    works: list[Any]
    stamps: torch.Tensor
    rounds: Callable[[np.ndarray], Rounds]
    after: Callable[[], None] | None = None
    done: bool = False


class EmulatedProcessGroup(dist.ProcessGroup):
    """A torch.distributed ProcessGroup over an inner gloo group, slowed to the emulated links."""

    def __init__(self, inner: Any, rank: int, size: int, global_ranks: Sequence[int],
                 state: EmulationState) -> None:
        super().__init__(rank, size)
        self._inner = inner
        self._global_ranks = tuple(int(r) for r in global_ranks)
        self._state = state
        self._group_devices = [state.devices[g] for g in self._global_ranks]
        self._pending: list[_Pending] = []
        self.spans: list[tuple[str, float, float]] = []  # (op, emulated start, end) of each collective
        self._free_s = float("-inf")
        self._seq = 0
        self._name = ""
        self._desc = ""

    # -- identity (init_device_mesh needs the group name round trip) --
    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def devices(self) -> list[int]:
        """The cluster device of each group rank."""
        return list(self._group_devices)

    @property
    def inner(self) -> Any:
        """The plain gloo group under this one: its exchanges take no emulated time (a caller that times its
        messages itself, as asynchronous DiLoCo's wire does: geotrain.sync.async_timing)."""
        return self._inner

    @property
    def state(self) -> EmulationState:
        """This process's emulation: network, devices, clock and records."""
        return self._state

    def now_s(self) -> float:
        """This process's emulated clock, seconds (every group of the process shares it)."""
        with self._state.lock:
            return self._state.clock.now()

    # -- the collective machinery --
    def _issue(self, op: str, nbytes: float, works: list[Any], rounds: Callable[[np.ndarray], Rounds],
               result: list[torch.Tensor], after: Callable[[], None] | None = None,
               send_bytes: Sequence[float] | None = None) -> EmulatedWork:
        with self._state.lock:
            n = self.size()
            stamp = torch.zeros(2 + n, dtype=torch.float64)
            stamp[0] = self._state.clock.now()
            # a member that sees cut links says so in its stamp: every member then fails the operation at
            # wait() alike (one that skipped the real exchange instead would leave the others blocked in it)
            stamp[1] = float(bool(self._state.cut_among(self._group_devices)))
            if send_bytes is not None:
                stamp[2:] = torch.tensor(list(send_bytes), dtype=torch.float64)
            stamps = torch.empty(n * (2 + n), dtype=torch.float64)
            stamp_work = self._inner._allgather_base(stamps, stamp)
            pending = _Pending(op, self._seq, nbytes, [stamp_work, *works], stamps, rounds, after)
            self._seq += 1
            self._pending.append(pending)
        return EmulatedWork(lambda: self._complete_through(pending), result)

    def _complete_through(self, target: _Pending) -> None:
        """Finish every pending collective up to `target`, in issue order (all members agree on it)."""
        with self._state.lock:
            while not target.done:
                self._finish(self._pending.pop(0))

    def _finish(self, pending: _Pending) -> None:
        state, n = self._state, self.size()
        held = state.clock.hold()
        for work in pending.works:
            work.wait()
        stamps = pending.stamps.view(n, 2 + n).numpy()
        if stamps[:, 1].any():
            pending.done = True  # not delivered: the real exchange ran, its result is not handed over
            state.check_links(self._group_devices, pending.op, cut_seen=True)
        start = max(float(stamps[:, 0].max()), self._free_s)
        transfers, end = run_rounds(state.network, self._group_devices, self._global_ranks,
                                    pending.rounds(stamps[:, 2:]), start, pending.op, pending.seq)
        self._free_s = end
        self.spans.append((pending.op, start, end))
        state.record(transfers)
        if self.rank() == 0:
            state.ops.append(OpRecord(pending.op, pending.seq, self._name, self._global_ranks,
                                      pending.nbytes, start, end))
        if pending.after is not None:
            with torch.no_grad():
                pending.after()
        pending.done = True
        state.clock.finish(held, end)

    # -- collectives --
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.AllreduceOptions()
        b = tensor_bytes(tensors)
        return self._issue("allreduce", b, [self._inner.allreduce(tensors, opts)],
                           lambda _s: algorithms.ring_allreduce(self.size(), b), tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        b = tensor_bytes(tensors)
        return self._issue("allreduce", b, [self._inner.allreduce_coalesced(tensors, opts)],
                           lambda _s: algorithms.ring_allreduce(self.size(), b), tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.BroadcastOptions()
        b, root = tensor_bytes(tensors), opts.rootRank
        return self._issue("broadcast", b, [self._inner.broadcast(tensors, opts)],
                           lambda _s: algorithms.binomial_broadcast(self.size(), root, b), tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.ReduceOptions()
        b, root = tensor_bytes(tensors), opts.rootRank
        return self._issue("reduce", b, [self._inner.reduce(tensors, opts)],
                           lambda _s: algorithms.binomial_reduce(self.size(), root, b), tensors)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._issue_allgather(self._inner.allgather(output_tensors, input_tensors, opts), output_tensors,
                                     input_tensors)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                            opts: Any = None) -> EmulatedWork:
        """gloo's own (until the conformance test it was missing: torch's base method, reached instead,
        raised "No backend type associated with device type cpu")."""
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._issue_allgather(self._inner.allgather_coalesced(output_lists, input_tensors, opts),
                                     output_lists, input_tensors)

    def _issue_allgather(self, work: Any, output_lists: list[list[torch.Tensor]],
                         input_tensors: list[torch.Tensor]) -> EmulatedWork:
        b = tensor_bytes(input_tensors)
        return self._issue("allgather", b, [work], lambda _s: algorithms.ring_allgather(self.size(), b),
                           [t for ts in output_lists for t in ts])

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.AllgatherOptions()
        b = tensor_bytes([input])
        return self._issue("allgather", b, [self._inner._allgather_base(output, input, opts)],
                           lambda _s: algorithms.ring_allgather(self.size(), b), [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.AllgatherOptions()
        b = tensor_bytes(inputs)
        works = [self._inner._allgather_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return self._issue("allgather", b, works, lambda _s: algorithms.ring_allgather(self.size(), b), outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        b = tensor_bytes([input])
        return self._issue("reduce_scatter", b, [self._inner._reduce_scatter_base(output, input, opts)],
                           lambda _s: algorithms.ring_reduce_scatter(self.size(), b), [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> EmulatedWork:
        """gloo's own list-form reduce-scatter (until the conformance test, one `_reduce_scatter_base` of
        the concatenated pieces: same values, but summed in another order, so other bits for 3 ranks)."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        b = tensor_bytes([t for ins in input_lists for t in ins])
        return self._issue("reduce_scatter", b, [self._inner.reduce_scatter(outputs, input_lists, opts)],
                           lambda _s: algorithms.ring_reduce_scatter(self.size(), b), outputs)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        b = tensor_bytes(inputs)
        works = [self._inner._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return self._issue("reduce_scatter", b, works,
                           lambda _s: algorithms.ring_reduce_scatter(self.size(), b), outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.GatherOptions()
        b, root = tensor_bytes(input_tensors), opts.rootRank
        return self._issue("gather", b, [self._inner.gather(output_tensors, input_tensors, opts)],
                           lambda _s: algorithms.gather(self.size(), root, b),
                           [t for ts in output_tensors for t in ts])

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.ScatterOptions()
        b, root = tensor_bytes(output_tensors), opts.rootRank
        return self._issue("scatter", b, [self._inner.scatter(output_tensors, input_tensors, opts)],
                           lambda _s: algorithms.scatter(self.size(), root, b), output_tensors)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> EmulatedWork:
        opts = opts if opts is not None else dist.AllToAllOptions()
        n = self.size()
        row_bytes = input[0].numel() * input.element_size() if input.dim() > 0 and len(input) else 0
        splits = list(input_split_sizes) or [len(input) // n] * n
        send = [s * row_bytes for s in splits]
        work = self._inner.alltoall_base(output, input, list(output_split_sizes), list(input_split_sizes), opts)
        return self._issue("all_to_all", tensor_bytes([input]), [work],
                           lambda sent: algorithms.all_to_all(sent), [output], send_bytes=send)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> EmulatedWork:
        """List form: gloo's own alltoall, so what gloo refuses (pieces of unequal sizes) is refused here
        too (until the conformance test this was a flat all_to_all_single, which accepted them)."""
        opts = opts if opts is not None else dist.AllToAllOptions()
        in_splits = [float(t.numel() * t.element_size()) for t in inputs]
        return self._issue("all_to_all", sum(in_splits), [self._inner.alltoall(outputs, inputs, opts)],
                           lambda sent: algorithms.all_to_all(sent), outputs, send_bytes=in_splits)

    def barrier(self, opts: Any = None) -> EmulatedWork:
        # the members' stamp exchange is the real synchronisation
        return self._issue("barrier", 0.0, [], lambda _s: algorithms.dissemination_barrier(self.size()), [])

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier (names the missing ranks), then the emulated barrier."""
        self._inner.monitored_barrier(timeout or timedelta(minutes=30), wait_all_ranks)
        self.barrier().wait()

    # -- point-to-point --
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> EmulatedWork:
        state = self._state
        state.check_links((state.device, self._group_devices[dst]), "send")
        with state.lock:
            payload = _as_bytes(_check_p2p(tensors))
            dst_device = self._group_devices[dst]
            start, done, arrival = state.queues.send(dst_device, float(payload.numel()), state.clock.now())
            state.transfers.append(Transfer("send", state.p2p_sent, state.device, dst_device, state.rank,
                                            self._global_ranks[dst], float(payload.numel()), start, arrival, done))
            state.p2p_sent += 1
            header = torch.tensor([start, arrival], dtype=torch.float64).view(torch.uint8)
            message = torch.cat([header, payload])
            work = self._inner.send([message], dst, tag)

        def finish() -> None:
            held = state.clock.hold()
            work.wait()
            state.clock.finish(held, done)
        return EmulatedWork(finish, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> EmulatedWork:
        state, tensor = self._state, _check_p2p(tensors)
        state.check_links((state.device, self._group_devices[src]), "recv")
        message = torch.empty(HEADER_BYTES + tensor.numel() * tensor.element_size(), dtype=torch.uint8)
        work = self._inner.recv([message], src, tag)

        def finish() -> None:
            held = state.clock.hold()
            work.wait()
            start, arrival = (float(x) for x in message[:HEADER_BYTES].view(torch.float64))
            with torch.no_grad():  # pipelining receives into leaf tensors that require grad
                tensor.copy_(message[HEADER_BYTES:].view(tensor.dtype).view(tensor.shape))
            state.clock.finish(held, arrival)
            result.emulated_span = (start, arrival)
        result = EmulatedWork(finish, tensors)
        return result

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> EmulatedWork:
        raise NotImplementedError("geotrain.emulate: recv from any source is not emulated; name the sender")

    def __repr__(self) -> str:
        return f"EmulatedProcessGroup(rank={self.rank()}, size={self.size()}, devices={self._group_devices})"
