"""The per-step exchange of one stage's DP group through a one-group reducer of geotrain.comm (the
codec spec: any codec with error feedback, distributed PowerSGD, ...), every collective run through
the transport, which times it (the emulated span of the group's collectives; for an all-gather the
emulation charges an all-reduce's time: documented in docs/history/runtime.md).

The reducer encodes the flat stage gradient as one tensor (granularity "flat"); summable codecs
(none, fp16, bf16, randk) all-reduce the payload in compressed form, the others all-gather the packed
payloads and every member decodes and sums them in rank order, so every member of the group gets
bit-identical gradients.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from geotrain.codecs import CodecSpec
from geotrain.comm import ReducerContext, TorchCollective, get_reducer, reducer_traits
from geotrain.comm.codec_reducer import CodecReducer
from geotrain.comm.gather import GatherLinks
from geotrain.comm.grouped import GroupedCodecReducer
from geotrain.optim.shards import local_shard
from geotrain.sync.base import CollectivePause, CollectiveTransport, StepTimer, SyncError, host_gradients, set_grads

T = TypeVar("T")


class PostedThroughTransport:
    """`collective` (a TorchCollective) whose posted collectives are waited for through
    `transport.collective(..., posted=True)`: the transport records each one's bytes (those the ledger
    counted when it was posted) and its time (module doc of geotrain.runtime.transport) when it is
    waited for. Everything else is the collective's own."""

    def __init__(self, collective: TorchCollective, transport: CollectiveTransport, group: Any,
                 group_devices: list[int], pause: CollectivePause | None = None) -> None:
        """`pause`: entered around each wait (its time is not compute)."""
        self._collective = collective
        self._transport = transport
        self._group = group
        self._devices = group_devices
        self._pause = pause

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collective, name)

    def start_all_gather(self, tensors: Sequence[torch.Tensor], algorithm: str = "ring") -> _WaitedThroughTransport:
        return self._post(lambda posted: self._collective.start_all_gather(posted, algorithm), tensors)

    def start_all_reduce_sum(self, tensors: Sequence[torch.Tensor]) -> _WaitedThroughTransport:
        return self._post(self._collective.start_all_reduce_sum, tensors)

    def _post(self, post: Callable[[Sequence[torch.Tensor]], Any],
              tensors: Sequence[torch.Tensor]) -> _WaitedThroughTransport:
        before = self._collective.ledger.handed_bytes
        started = post(tensors)
        nbytes = self._collective.ledger.handed_bytes - before

        def wait() -> torch.Tensor:
            with nullcontext() if self._pause is None else self._pause():
                return self._transport.collective(self._group, self._devices, nbytes, started.wait, posted=True)

        return _WaitedThroughTransport(wait)


class _WaitedThroughTransport:
    """A posted collective: `wait()` waits for it through the transport, once."""

    def __init__(self, wait: Callable[[], torch.Tensor]) -> None:
        self._wait = wait
        self._result: torch.Tensor | None = None

    def wait(self) -> torch.Tensor:
        if self._result is None:
            self._result = self._wait()
        return self._result


def timed_collective(transport: CollectiveTransport, group: Any, group_devices: list[int],
                     pause: CollectivePause | None = None, host_copies: bool = False) -> TorchCollective:
    """A collective of the DP group `group` whose every call goes through `transport.collective`, inside
    `pause()` (its time is not the sync's compute) when given; `host_copies`: TorchCollective's (GPU tensors
    travel as host copies)."""
    def wrap(nbytes: int, run: Callable[[], Any]) -> Any:
        with nullcontext() if pause is None else pause():
            return transport.collective(group, group_devices, nbytes, run)

    return TorchCollective(group, wrap, host_copies)


class DirectTransport:
    """A CollectiveTransport that runs each collective as it is (no emulation of its own: under
    `geotrain emulate` the process group does the timing); adds up their wall seconds and the bytes
    they declare (`nbytes`, a callable read after the run, as the runtime's Transport does)."""

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.nbytes = 0

    def collective(self, group: Any, devices: list[int], nbytes: int | Callable[[], int], run: Callable[[], T],
                   posted: bool = False) -> T:
        started = time.perf_counter()
        try:
            return run()
        finally:
            self.wall_s += time.perf_counter() - started
            self.nbytes += nbytes() if callable(nbytes) else nbytes


@dataclass(frozen=True)
class ExtraTensors:
    """Tensors that travel in another exchange's collective through their own codec (StageExchange's `extra`)."""

    named_params: list[tuple[str, torch.nn.Parameter]]
    codec: CodecSpec
    error_feedback: bool


def grouped_reducer(parts: Sequence[ExtraTensors], world_size: int,
                    gather_links: GatherLinks | None = None) -> GroupedCodecReducer:
    """One GroupedCodecReducer over `parts` (each through its codec, in order) for a group of `world_size`;
    SyncError for a part whose codec is its own exchange (PowerSGD)."""
    for part in parts:
        if not reducer_traits(part.codec).hierarchical:  # its own exchange (powersgd), not a codec's
            raise SyncError(f"codec {str(part.codec)!r} is its own exchange; tensors sent beside others in one "
                            f"collective take a codec of geotrain.codecs")
    return GroupedCodecReducer(
        [CodecReducer(part.codec.build(), [(name, local_shard(p).shape) for name, p in part.named_params], world_size,
                      error_feedback=part.error_feedback, gather_links=gather_links) for part in parts],
        gather_links)


class StageExchange:
    """Averages the gradients of `named_params` over a DP group through the reducer of `spec` (a sharded
    parameter's, DTensor: its local shard's, with the same shard's peers on the group)."""

    def __init__(self, named_params: Sequence[tuple[str, torch.nn.Parameter]], spec: CodecSpec | str,
                 error_feedback: bool, transport: CollectiveTransport, group: Any, group_devices: list[int],
                 gather_links: GatherLinks | None = None, extra: Sequence[ExtraTensors] = ()) -> None:
        """`gather_links`: the group's links, to choose each gathered exchange's algorithm (None: ring).
        `extra`: more tensors that travel in the same collective, each group through its own codec (a
        codec of geotrain.codecs; geotrain.comm.grouped): their means are written into their gradients too.
        An exchange may send only the first parts (`parts` of exchange and start: `named_params` first, then
        `extra`'s groups in order); the others' gradients are left as they are."""
        self.parts = [[param for _, param in named_params]] + [[p for _, p in group_.named_params] for group_ in extra]
        self.params = [p for part in self.parts for p in part]
        self.pause = CollectivePause()
        self.collective = timed_collective(transport, group, group_devices, self.pause)
        self.posting = PostedThroughTransport(self.collective, transport, group, group_devices, self.pause)
        world = self.collective.world_size
        if not extra:
            context = ReducerContext.of([(name, local_shard(p).shape) for name, p in named_params], world,
                                        error_feedback=error_feedback,
                                        extra={} if gather_links is None else {"gather_links": gather_links})
            self.reducer = get_reducer(CodecSpec.parse(spec), context)
            return
        self.reducer = grouped_reducer([ExtraTensors(list(named_params), CodecSpec.parse(spec), error_feedback),
                                        *extra], world, gather_links)

    @staticmethod
    def fresh_state(named_params: Sequence[tuple[str, torch.nn.Parameter]], spec: CodecSpec | str,
                    error_feedback: bool) -> dict[str, Any]:
        """`state_dict()` of a new exchange of `named_params` (no residuals yet): what a checkpoint written
        by an exchange that keeps no state of its own (an elastic run's) holds for a resumed StageExchange."""
        context = ReducerContext.of([(name, local_shard(p).shape) for name, p in named_params], 1,
                                    error_feedback=error_feedback)
        return {"reducer": get_reducer(CodecSpec.parse(spec), context).state_dict()}

    def _travelling(self, parts: int | None) -> tuple[list[torch.nn.Parameter], dict[str, int]]:
        """The parameters of the first `parts` parts (None: all) and the reducer's keyword for them."""
        if parts is None or parts == len(self.parts):
            return self.params, {}
        if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= len(self.parts):
            raise SyncError(f"StageExchange: parts must be an integer in 1..{len(self.parts)}, got {parts!r}")
        return [p for part in self.parts[:parts] for p in part], {"parts": parts}

    def exchange(self, step: int, timer: StepTimer, parts: int | None = None) -> int:
        """Replace every gradient (of the first `parts` parts; None: all) by the group mean (as the reducer
        delivers it); returns the bytes this rank handed to the collectives. The reducer's own work
        (encoding, decoding, PowerSGD's products) is timed by `timer` as compute (its clock), the
        collectives excluded (CollectivePause)."""
        params, keyword = self._travelling(parts)
        before = self.collective.ledger.handed_bytes
        with self.pause.timing(timer):
            grads = host_gradients(params)
            set_grads(params, self.reducer.reduce([grads], self.collective, step, **keyword))
        return self.collective.ledger.handed_bytes - before

    def start(self, step: int, timer: StepTimer, parts: int | None = None) -> Callable[[], int]:
        """`exchange` in two halves, to overlap it with compute: encode and post the collective now
        (async work of the group), return a function that waits, writes the means into the gradients
        and returns the bytes handed. The reducer's own work is timed by `timer` as compute, here and
        in the returned function (pass it the timer of the step it runs in)."""
        if not hasattr(self.reducer, "start"):
            raise SyncError(f"the {self.reducer.name!r} reducer cannot overlap its exchange with compute "
                            f"(only codecs of geotrain.codecs can); use delay 0")
        params, keyword = self._travelling(parts)
        before = self.collective.ledger.handed_bytes
        with self.pause.timing(timer):
            grads = host_gradients(params)
            finish = self.reducer.start([grads], self.posting, step, **keyword)
        handed = self.collective.ledger.handed_bytes - before

        def land(landing_timer: StepTimer = timer) -> int:
            with self.pause.timing(landing_timer):  # the wait excluded, the decoding counted
                set_grads(params, finish())
            return handed

        return land

    def state_dict(self) -> dict[str, Any]:
        return {"reducer": self.reducer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "reducer" not in state:
            raise ValueError("checkpoint holds no data-parallel reducer state")
        self.reducer.load_state_dict(state["reducer"])
