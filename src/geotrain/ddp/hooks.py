"""Any geotrain reducer as a DDP communication hook, on any backend (gloo included) and bucket layout.

    state = register_codec_hook(ddp_model, "topk", fraction=0.01)   # or a Codec, or "powersgd", rank=4
    ...train as usual...
    torch.save({"model": ..., "hook": state.state_dict()}, path)    # residuals (and Q's) per parameter

The algorithm is the reducer's (geotrain.comm: codec + error feedback, distributed PowerSGD, ...);
the hook only meets DDP:
- a reducer that takes any subset of the parameters (the codec reducer) reduces each bucket as DDP
  hands it over, so there is one collective per bucket, as torch's own hooks do. For fp16 this is
  exactly torch's `fp16_compress_hook` (same casts, same division, same all-reduce).
- a whole-model reducer (PowerSGD: one shared basis per step) gets a pending future for every bucket
  but the last; at the last (`is_last()`) one round runs over the whole model in model order (the
  same on every rank, whatever the buckets) and completes every future. The collectives run on the
  thread that called the hook, never inside a future's callback: that nesting is what makes torch's
  `powerSGD_hook` hang on gloo with several buckets.
Collectives are synchronous (a completed future is returned): simpler and deterministic, at the
price of no overlap of communication with the backward pass.

`granularity="tensor"` (default) encodes each parameter's gradient with its own shape, so the result
does not depend on how DDP groups parameters into buckets; `"bucket"` encodes each bucket's gradients
concatenated in model order as one tensor. Residuals are kept per parameter name either way, so they
survive DDP's bucket rebuild after the first iteration and a checkpoint restores into any layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from geotrain.codecs import Codec, CodecError, parse_count, parse_flag
from geotrain.comm import CommLedger, ReducerContext, TorchCollective, get_reducer
from geotrain.ddp.hook_target import require_ddp_model

GRANULARITIES = {"tensor": "tensor", "bucket": "flat"}
"""The hook's names of the codec reducer's granularities."""


@dataclass
class _PendingBucket:
    buffer: torch.Tensor
    names: tuple[str, ...]
    offsets: tuple[int, ...]
    future: torch.futures.Future[torch.Tensor]


@dataclass
class CodecHookState:
    """Everything the hook keeps between calls: save it with `state_dict()`, restore with `load_state_dict()`.

    `ledger` counts the tensors handed to the process group (measured at the call); `declared_bytes`
    what the reducer says one rank hands, so the two must agree. iteration: backward passes completed
    (seeded codecs use it as their step, the same on all ranks). `buckets_per_step`: hook calls in the
    last completed step (DDP's bucket count).
    """

    reducer: Any
    collective: TorchCollective
    param_names: dict[int, str]
    param_order: dict[str, int]
    param_shapes: dict[str, tuple[int, ...]]
    ledger: CommLedger  # the collective's: what this rank handed to the process group
    iteration: int = 0
    buckets_per_step: int = 0
    _calls: int = 0
    _pending: list[_PendingBucket] = field(default_factory=list)

    @property
    def declared_bytes(self) -> int:
        return self.reducer.declared_bytes

    def state_dict(self) -> dict[str, Any]:
        """The reducer's state with this rank's residuals (one local worker) and the step counter."""
        state = self.reducer.state_dict()
        return {**state, "codec": self.reducer.name, "residuals": state["residuals"][0], "iteration": self.iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("codec") != self.reducer.name:
            raise CodecError(f"hook state is for codec {state.get('codec')!r}, not {self.reducer.name!r}")
        self.iteration = parse_count(state.get("iteration", 0), "hook state: iteration")  # 1.7, "3" refused
        self.reducer.load_state_dict({**state, "residuals": [state.get("residuals", {})]})


def register_codec_hook(ddp_model: Any, codec: Codec | str, error_feedback: bool = True, *,
                        granularity: str = "tensor", process_group: Any = None,
                        **codec_params: Any) -> CodecHookState:
    """Make the reducer of `codec` (a Codec, or a registered name built with `codec_params`, e.g.
    "powersgd" with PowerSGDConfig fields) the DDP model's gradient communication. Returns the hook
    state. Call before the first backward pass."""
    module = require_ddp_model(ddp_model, "register_codec_hook")
    error_feedback = parse_flag(error_feedback, "register_codec_hook: error_feedback")
    if granularity not in GRANULARITIES:
        raise CodecError(f"granularity must be one of {tuple(GRANULARITIES)}, got {granularity!r}")
    if isinstance(codec, Codec):
        if codec_params:
            raise CodecError(f"codec parameters {sorted(codec_params)} given with a Codec instance; pass a name instead")
    elif not isinstance(codec, str):
        raise CodecError(f"register_codec_hook needs a Codec or a codec name, got {type(codec).__name__}")
    named = [(name, param) for name, param in module.named_parameters() if param.requires_grad]
    collective = TorchCollective(process_group)
    context = ReducerContext.of([(name, tuple(p.shape)) for name, p in named], collective.world_size,
                                error_feedback=error_feedback, granularity=GRANULARITIES[granularity])
    reducer = get_reducer(codec, context, **codec_params)
    if reducer.whole_model and granularity != "tensor":
        raise CodecError(f"{type(reducer).__name__} reduces the whole model; granularity must be 'tensor', "
                         f"got {granularity!r}")
    state = CodecHookState(reducer, collective, {id(param): name for name, param in named},
                           {name: index for index, (name, _) in enumerate(named)},
                           {name: tuple(param.shape) for name, param in named}, collective.ledger)
    ddp_model.register_comm_hook(state, codec_hook)
    return state


def codec_hook(state: CodecHookState, bucket):  # type: ignore[no-untyped-def]
    """The DDP hook (see module doc): returns a Future of the averaged bucket. Unannotated on
    purpose: DDP rejects string annotations (PEP 563)."""
    buffer = bucket.buffer()
    base, itemsize = buffer.data_ptr(), buffer.element_size()
    entries = sorted(((state.param_names[id(param)], (grad.data_ptr() - base) // itemsize)
                      for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True)),
                     key=lambda entry: state.param_order[entry[0]])  # model order, whatever DDP's order
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    state._pending.append(_PendingBucket(buffer, tuple(e[0] for e in entries), tuple(e[1] for e in entries), future))
    state._calls += 1
    if not state.reducer.whole_model:
        _reduce(state, state._pending, whole_model=False)
        state._pending = []
    elif bucket.is_last():
        pending, state._pending = state._pending, []
        _reduce(state, pending, whole_model=True)
    if bucket.is_last():
        state.iteration += 1
        state.buckets_per_step, state._calls = state._calls, 0
    return future


def _reduce(state: CodecHookState, pending: list[_PendingBucket], whole_model: bool) -> None:
    """One reducer call over the pending buckets' parameters (every parameter, in model order, for a
    whole-model reducer); writes the means into the buckets and completes their futures."""
    where = {name: (entry, offset) for entry in pending for name, offset in zip(entry.names, entry.offsets, strict=True)}
    names = [name for name in state.param_order if name in where]
    if whole_model and len(names) != len(state.param_order):
        missing = [name for name in state.param_order if name not in where]
        raise CodecError(f"{type(state.reducer).__name__} hook: this step's buckets lack gradients of {missing[:5]}")
    grads = []
    for name in names:
        entry, offset = where[name]
        shape = state.param_shapes[name]
        grads.append(entry.buffer[offset:offset + torch.Size(shape).numel()].view(shape))
    means = state.reducer.reduce([grads], state.collective, state.iteration, *([] if whole_model else [names]))
    for grad, mean in zip(grads, means, strict=True):
        grad.copy_(mean)
    for entry in pending:
        entry.future.set_result(entry.buffer)
