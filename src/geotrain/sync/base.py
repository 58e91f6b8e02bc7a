"""The gradient-synchronisation interface: what a data-parallel worker calls after its backward pass.

    sync = make_gradient_sync(options, named_params, transport, group, group_devices)  # geotrain.sync.factory
    sync.set_lr(lr); sync.optimizer.zero_grad()
    ... forward, backward ...
    dp_bytes, grad_norm = sync.step(step, timer)     # exchange (or not, this step), clip, optimizer step
    sync.fingerprint()                               # a float every replica agrees on after a sync
    sync.settle(timer); sync.state_dict() / sync.load_state_dict(state)  # checkpoint

An implementation decides what travels and when: every step the gradients (PerStepSync: a flat
codec reducer, PowerSGD, the hierarchical all-reduce), the optimizer's own momenta (OneBitAdamSync),
or every H steps the outer gradients (OuterSync: local SGD / DiLoCo). Every collective it runs goes
through the transport (`CollectiveTransport.collective`), which times it: there is no second timing
path. `timer` measures the compute inside the step (codec work, optimizer) with communication excluded.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

import torch

from geotrain.errors import GeotrainError
from geotrain.optim.shards import is_sharded, local_shard

T = TypeVar("T")


class SyncError(GeotrainError, ValueError):
    """A gradient-sync option or combination that cannot run (named with its value and source);
    `fields`: the SyncOptions fields a combination error is about (callers map them to their own keys)."""

    def __init__(self, message: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fields = fields


class StepTimer(Protocol):
    """Accumulates compute seconds: `with timer:` times a block; `seconds` may be added to directly."""

    seconds: float

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


@dataclass
class ComputeTimer:
    """Accumulates seconds spent computing (forward, backward, codecs, optimizer) by `clock` (wall seconds;
    under link emulation the emulated clock's own, so that compute and emulated time are counted alike:
    geotrain.emulate.install.COMPUTE_CLOCKS), times `scale` (the emulated device's slowness against this
    machine, RuntimeConfig.compute_scale; 1: as measured)."""

    seconds: float = 0.0
    scale: float = 1.0
    clock: Callable[[], float] = time.perf_counter
    device_sync: Callable[[], None] | None = None
    """Waits for the device's queued work (torch.cuda.synchronize on a GPU): its kernels run asynchronously."""
    _started: float | None = field(default=None, repr=False)

    def __enter__(self) -> ComputeTimer:
        if self.device_sync is not None:
            self.device_sync()
        self._started = self.clock()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._started is not None
        if self.device_sync is not None:
            self.device_sync()
        self.seconds += self.scale * (self.clock() - self._started)
        self._started = None


class CollectivePause:
    """Counts a sync's own work (encoding, decoding, optimizer) as compute and its collectives' time as not,
    by the step timer's own clock and scale: `with pause.timing(timer):` times the work inside by `timer`,
    and each collective of the sync runs inside `pause()`, which stops `timer` before it and restarts it
    after (nothing while no timing is under way). Under `--compute-clock cpu` a collective's wait is then
    not counted as compute, and the codecs' CPU seconds are counted as every other compute is."""

    def __init__(self) -> None:
        self._timer: StepTimer | None = None

    @contextmanager
    def timing(self, timer: StepTimer) -> Iterator[None]:
        self._timer = timer
        try:
            with timer:
                yield
        finally:
            self._timer = None

    @contextmanager
    def __call__(self) -> Iterator[None]:
        timer = self._timer
        if timer is None:
            yield
            return
        timer.__exit__(None, None, None)
        try:
            yield
        finally:
            timer.__enter__()


class CollectiveTransport(Protocol):
    """Runs and times the collectives of one or more process groups (geotrain.runtime.transport.Transport)."""

    def collective(self, group: Any, devices: list[int], nbytes: int | Callable[[], int],
                   run: Callable[[], T], posted: bool = False) -> T:
        """Run `run()` and record it; `posted`: `run` waits for a collective posted earlier (async work
        overlapping compute), so the members need not meet first."""
        ...


class SyncResult(NamedTuple):
    """One step's synchronisation: bytes this rank handed to its DP collectives, and the global gradient
    norm before clipping (None when not measured this step)."""

    dp_bytes: int
    grad_norm: float | None


class SyncListener(Protocol):
    """Told when an outer sync starts and when it lands (a run's observer, geotrain.observe.observer): `step` is
    the 0-based step after which it happens, `fragment` the model fragment (0 without fragments); a landing
    names the step its sync `started` after and the bytes this rank handed to its collectives. A blocking sync
    starts and lands after the same step."""

    def sync_started(self, step: int, fragment: int) -> None: ...

    def sync_landed(self, step: int, fragment: int, nbytes: int, started: int) -> None: ...


class GradientSync(ABC):
    """One data-parallel synchronisation scheme of a stage's parameters (see the module doc)."""

    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    """The optimizer of the parameters (the inner one for OuterSync): its lr is what `set_lr` sets."""
    listener: SyncListener | None = None
    """Told of each outer sync's start and landing (schemes with outer syncs call `_sync_started` and
    `_sync_landed`; set by the caller, e.g. the runtime's worker)."""

    def _sync_started(self, step: int, fragment: int = 0) -> None:
        if self.listener is not None:
            self.listener.sync_started(step, fragment)

    def _sync_landed(self, step: int, nbytes: int, fragment: int = 0, started: int | None = None) -> None:
        if self.listener is not None:
            self.listener.sync_landed(step, fragment, nbytes, step if started is None else started)

    @abstractmethod
    def step(self, step: int, timer: StepTimer) -> SyncResult:
        """After backward at 0-based `step`: synchronise what this scheme synchronises now, clip, step."""

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def fingerprint(self) -> float:
        """A float64 sum of the weights the replicas agree on (here: the parameters)."""
        return float(sum(p.detach().double().sum() for p in self.params))

    def settle(self, timer: StepTimer) -> None:
        """Before a checkpoint (every rank of the group calls it at the same point of the schedule): wait for
        the exchanges in flight and keep what they delivered, applied later when each is due (sync/settle.py),
        so that `state_dict()` holds them. No number changes; only the wait is exposed. Nothing by default."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs (optimizer state, residuals, anchors, settled exchanges in flight)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`; ValueError when it was written by another scheme."""


class DPExchange(Protocol):
    """Replaces every parameter's gradient by the DP group's mean, in place."""

    def exchange(self, step: int, timer: StepTimer) -> int:
        """Average now; returns the bytes this rank handed to the collectives."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def host_gradients(params: Sequence[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Each parameter's gradient (zeros where it has none) in host memory: what the exchanges encode and
    hand to their collectives. On a GPU this is a copy, so the codecs, their residuals and the DP
    collectives (gloo beside NCCL) run on the CPU; a CPU gradient is returned as it is, not copied. A sharded
    parameter's (DTensor, geotrain.optim.shards): its local shard's."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    return [(local_shard(g) if is_sharded(g) else g).to("cpu") for g in grads]


GPU_ONLY_BACKENDS = ("nccl",)
"""torch.distributed backends that take no host tensors: a group of one of these alone cannot carry the
exchanges' host copies (`host_gradients`)."""


def check_host_backend(backend: str, who: str) -> None:
    """SyncError unless process-group `backend` (torch.distributed.get_backend's string) takes host
    tensors: "gloo", a per-device string with a cpu entry ("cpu:gloo,cuda:nccl"), the emulating one."""
    if str(backend).lower() in GPU_ONLY_BACKENDS:
        raise SyncError(f"{who}: the process group's backend {backend!r} carries GPU tensors only, and the "
                        "exchanges encode host copies of the gradients; use init_process_group("
                        "'cpu:gloo,cuda:nccl') or give no backend (torch then creates both)")


def grad_carrier(shape: torch.Size, device: torch.device | str) -> torch.nn.Parameter:
    """An fp32 parameter of `shape` that holds no values (one element, expanded: 4 bytes): an outer sync's
    stand-in whose `.grad` alone carries data (the outer gradient an exchange reads, the mean it writes back),
    so that the inner loop's own gradients stay untouched while an exchange is in flight."""
    return torch.nn.Parameter(torch.zeros(1, dtype=torch.float32, device=device).expand(shape), requires_grad=False)


def free_grads(params: Sequence[torch.nn.Parameter]) -> None:
    """Drop the gradients of `params` (grad carriers after their exchange landed: nothing reads them until the
    next sync writes them anew)."""
    for p in params:
        p.grad = None


def set_grads(params: Sequence[torch.nn.Parameter], values: Sequence[torch.Tensor]) -> None:
    """Write `values` (shaped like the parameters, on any device; a sharded parameter's: like its local shard)
    into the gradients, creating missing ones on the parameter's device."""
    for p, value in zip(params, values, strict=True):
        if p.grad is None and not is_sharded(p):
            p.grad = value.to(p.device, copy=True)
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # a DTensor sharded as the parameter
        local_shard(p.grad).copy_(value)
