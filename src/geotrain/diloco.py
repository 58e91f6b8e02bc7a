"""DiLoCo for any training loop: wrap the model and its inner optimizer, keep the loop as it is.

    dist.init_process_group("gloo")            # plain, under torchrun, `geotrain emulate` or netlab
    with DiLoCo(model, inner_optimizer, sync_every=H, fragments=P, delay=tau, codec="int8-block",
                outer_lr=0.7, outer_momentum=0.9) as diloco:
        for batch in data:
            inner_optimizer.zero_grad()
            loss_fn(model(batch)).backward()
            inner_optimizer.step()             # the outer sync runs from this step's post hook
    # on leaving the block every fragment has synced: all ranks hold the same parameters

The outer synchronisation is geotrain.sync.StreamingOuterSync (the one implementation, also behind
`geotrain train --sync-every`): P fragments on a staggered schedule, each exchange overlapped with
tau inner steps and mixed in with `mix` (Streaming DiLoCo's alpha), outer gradients through any codec
of geotrain.codecs with error feedback (the codec reducer of geotrain.comm). See docs/diloco.md.

Groups: `group=None` is the default process group. Every exchange is posted from the training
thread (async work when tau > 0), so the loop may run its own collectives (a loss all-reduce) on the
same group between them.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from geotrain.codecs import CodecSpec
from geotrain.optim.outer import DILOCO_LR, DILOCO_MOMENTUM, OuterStepError, check_outer_settings
from geotrain.sync.base import DPExchange, SyncError
from geotrain.sync.exchange import DirectTransport, StageExchange
from geotrain.sync.streaming import StreamingOuterSync

class _ComputeSeconds:
    """StepTimer of the outer sync's compute on the training thread (codec work, outer steps)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __enter__(self) -> _ComputeSeconds:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._started


class DiLoCo:
    """Streaming DiLoCo around a user's loop (module doc). Outer settings: `sync_every` H inner steps per
    outer period, `fragments` P (1..H), `delay` tau (0..H-1 steps a sync lands late), `mix` alpha in
    [0, 1], `codec` a codec spec of the outer gradients, `error_feedback` on by default."""

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer, *, sync_every: int,
                 fragments: int = 1, delay: int = 0, mix: float = 0.0, codec: str | CodecSpec = "int8-block",
                 error_feedback: bool = True, outer_lr: float = DILOCO_LR, outer_momentum: float = DILOCO_MOMENTUM,
                 group: Any = None) -> None:
        try:
            check_outer_settings(sync_every, outer_lr, outer_momentum, "DiLoCo")
        except OuterStepError as exc:
            raise SyncError(str(exc)) from None
        if not dist.is_initialized():
            raise SyncError("DiLoCo needs torch.distributed.init_process_group() first (one process per replica)")
        self.model = model
        self.inner_optimizer = inner_optimizer
        self.codec = CodecSpec.parse(codec)
        self.transport = DirectTransport()
        self.group = group
        self.error_feedback = error_feedback
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.exchanges: list[StageExchange] = []
        self.sync = StreamingOuterSync(named, inner_optimizer, self._exchange_of, sync_every, fragments, delay,
                                       mix, outer_lr, outer_momentum, total_steps=None)
        self.timer = _ComputeSeconds()
        self.inner_steps = 0
        self.bytes_sent = 0
        """Bytes this rank handed to the outer exchanges' collectives (the codec's payloads)."""
        self._hook: Any = None

    def _exchange_of(self, named_shadows: list[tuple[str, torch.nn.Parameter]]) -> DPExchange:
        exchange = StageExchange(named_shadows, self.codec, self.error_feedback, self.transport, self.group, [])
        self.exchanges.append(exchange)
        return exchange

    @property
    def declared_bytes(self) -> int:
        """What the codec declared for every payload encoded so far (sum of payload.nbytes)."""
        return sum(exchange.reducer.declared_bytes for exchange in self.exchanges)

    def __enter__(self) -> DiLoCo:
        self._hook = self.inner_optimizer.register_step_post_hook(self._after_inner_step)
        return self

    def _after_inner_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.bytes_sent += self.sync.after_inner_step(self.inner_steps, self.timer)
        self.inner_steps += 1

    def flush(self) -> None:
        """Land every sync in flight and sync every fragment now: all replicas agree afterwards."""
        self.bytes_sent += self.sync.flush(max(self.inner_steps - 1, 0), self.timer)

    def __exit__(self, exc_type: Any, *rest: object) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if exc_type is None:
            self.flush()
        else:
            self.sync.close()

    def fingerprint(self) -> float:
        """A float64 sum of the anchors: the same on every rank when no sync is in flight."""
        return self.sync.fingerprint()

    def state_dict(self) -> dict[str, Any]:
        return {"sync": self.sync.state_dict(), "inner_steps": self.inner_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync.load_state_dict(state["sync"])
        self.inner_steps = int(state["inner_steps"])
