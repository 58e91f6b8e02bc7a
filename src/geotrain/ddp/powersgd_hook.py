"""Distributed PowerSGD as a DDP communication hook that works on gloo with any bucket layout.

    state = register_codec_hook(ddp_model, "powersgd", rank=4)      # or register_powersgd_hook(...)
    ...train as usual...
    torch.save({"model": ..., "hook": state.state_dict()}, path)     # Q's and residuals per parameter

The algorithm is `geotrain.ddp.powersgd` (Vogels et al. 2019: all-reduce P, orthonormalise,
all-reduce Q, error feedback, warm-started Q). How it meets DDP:
- DDP hands the hook one bucket at a time, always in the same order on every rank, the last one
  flagged `is_last()`. The hook answers every bucket but the last with a pending future, and at the
  last bucket runs one PowerSGD round over the whole model (parameters in model order: the same
  buffers on every rank, whatever the buckets), writes each bucket's averaged gradients and completes
  all the futures. Two collectives per step in total (uncompressed values + all P's, then all Q's),
  not two per bucket; the price is that communication does not overlap the backward pass.
- The collectives run on the thread that called the hook (autograd's), never inside a future's
  callback: that nesting is what makes torch's `powerSGD_hook` hang on gloo with several buckets.
- Residuals and Q's are kept per parameter name, so DDP's bucket rebuild after the first step and a
  checkpoint restored with another `bucket_cap_mb` change nothing (compression may start at step 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from geotrain.codecs import CodecError, PowerSGDCodec
from geotrain.ddp.accounting import CommLedger, tensor_bytes
from geotrain.ddp.hook_target import require_ddp_model
from geotrain.ddp.powersgd import PowerSGDConfig, PowerSGDLayout, PowerSGDReducer

CONFIG_FIELDS = tuple(f.name for f in fields(PowerSGDConfig))


@dataclass
class _PendingBucket:
    buffer: torch.Tensor
    names: tuple[str, ...]
    offsets: tuple[int, ...]
    future: torch.futures.Future[torch.Tensor]


@dataclass
class PowerSGDHookState:
    """What the hook keeps between calls; `state_dict()` / `load_state_dict()` save and restore it.

    `ledger` counts the tensors handed to the process group (measured at the call); `declared_bytes`
    is what the layout says one rank hands (uncompressed values + P's, then Q's, in fp32), so the two
    must agree. `buckets_per_step`: hook calls in the last completed step (DDP's bucket count).
    """

    reducer: PowerSGDReducer
    process_group: Any
    world_size: int
    param_names: dict[int, str]
    ledger: CommLedger = field(default_factory=CommLedger)
    buckets_per_step: int = 0
    _pending: list[_PendingBucket] = field(default_factory=list)

    @property
    def config(self) -> PowerSGDConfig:
        return self.reducer.config

    @property
    def iteration(self) -> int:
        return self.reducer.iteration

    @property
    def declared_bytes(self) -> int:
        return self.reducer.declared_bytes

    def state_dict(self) -> dict[str, Any]:
        """Codec name, config, step, this rank's residuals and the (shared) Q's, per parameter name."""
        reducer_state = self.reducer.state_dict()
        return {"codec": "powersgd", "config": reducer_state["config"], "iteration": reducer_state["iteration"],
                "qs": reducer_state["qs"], "residuals": reducer_state["residuals"][0]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("codec") != "powersgd" or "qs" not in state:
            raise CodecError(f"hook state is for codec {state.get('codec')!r}, not distributed 'powersgd'")
        self.reducer.load_state_dict({"config": state.get("config", {}), "iteration": state.get("iteration", 0),
                                      "qs": state["qs"], "residuals": [state.get("residuals", {})]})


def register_powersgd_hook(ddp_model: Any, error_feedback: bool = True, *, process_group: Any = None,
                           codec: PowerSGDCodec | None = None, **config: Any) -> PowerSGDHookState:
    """Make distributed PowerSGD the DDP model's gradient communication; returns the hook state.

    `config`: PowerSGDConfig fields (rank, start_powersgd_iter, min_compression_rate, seed,
    allow_nonfinite); a PowerSGDCodec instance gives its rank, seed and allow_nonfinite instead.
    Call before the first backward pass.
    """
    import torch.distributed as dist

    module = require_ddp_model(ddp_model, "register_powersgd_hook")
    unknown = sorted(set(config) - set(CONFIG_FIELDS) - {"error_feedback"})
    if unknown:
        raise CodecError(f"powersgd hook has no parameter(s) {', '.join(unknown)} (allowed: "
                         f"{', '.join(name for name in CONFIG_FIELDS if name != 'error_feedback')})")
    if codec is not None:
        config = {"rank": codec.rank, "seed": codec.seed, "allow_nonfinite": codec.allow_nonfinite, **config}
    config["error_feedback"] = config.get("error_feedback", error_feedback)  # PowerSGDConfig parses the flag
    named = [(name, param) for name, param in module.named_parameters() if param.requires_grad]
    settings = PowerSGDConfig(**config)
    layout = PowerSGDLayout.build([(name, tuple(param.shape)) for name, param in named], settings)
    world_size = dist.get_world_size(process_group)
    state = PowerSGDHookState(PowerSGDReducer(layout, settings, world_size), process_group, world_size,
                              {id(param): name for name, param in named})
    ddp_model.register_comm_hook(state, powersgd_hook)
    return state


def powersgd_hook(state: PowerSGDHookState, bucket):  # type: ignore[no-untyped-def]
    """The DDP hook (see module doc): a pending future for every bucket but the last, which runs the
    round for all of them. Unannotated on purpose: DDP rejects string annotations (PEP 563)."""
    buffer = bucket.buffer()
    base, itemsize = buffer.data_ptr(), buffer.element_size()
    grads = bucket.gradients()
    names = tuple(state.param_names[id(param)] for param in bucket.parameters())
    offsets = tuple((grad.data_ptr() - base) // itemsize for grad in grads)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    state._pending.append(_PendingBucket(buffer, names, offsets, future))
    if bucket.is_last():
        pending, state._pending = state._pending, []
        _run_round(state, pending)
        state.buckets_per_step = len(pending)
    return future


def _run_round(state: PowerSGDHookState, pending: list[_PendingBucket]) -> None:
    """One PowerSGD round over every parameter of the pending buckets; completes their futures."""
    layout = state.reducer.layout
    where: dict[str, tuple[_PendingBucket, int]] = {}
    for entry in pending:
        for name, offset in zip(entry.names, entry.offsets, strict=True):
            where[name] = (entry, offset)
    missing = [name for name in layout.names if name not in where]
    if missing:
        raise CodecError(f"powersgd hook: this step's buckets lack gradients of {missing[:5]}")
    grads = []
    for name, shape, index in zip(layout.names, layout.shapes, range(len(layout.names))):
        entry, offset = where[name]
        grads.append(entry.buffer[offset:offset + layout.numel(index)].view(shape))
    means = state.reducer.reduce([grads], lambda flats: _all_reduce(state, flats[0]))
    for grad, mean in zip(grads, means, strict=True):
        grad.copy_(mean)
    for entry in pending:
        entry.future.set_result(entry.buffer)


def _all_reduce(state: PowerSGDHookState, flat: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    state.ledger.record("all_reduce", tensor_bytes(flat), state.world_size)
    dist.all_reduce(flat, group=state.process_group)
    return flat
