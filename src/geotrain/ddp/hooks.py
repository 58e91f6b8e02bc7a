"""Any geotrain codec as a DDP communication hook, on any backend (gloo included) and bucket layout.

    state = register_codec_hook(ddp_model, "topk", fraction=0.01)   # or a Codec instance
    ...train as usual...
    torch.save({"model": ..., "hook": state.state_dict()}, path)    # residuals per parameter

How a bucket is exchanged (per rank; `x` = local gradient + error-feedback residual):
- summable codecs (none, fp16, bf16, randk): encode x, divide the wire buffers by the world size
  in their own dtype, all-reduce them (sum), decode. For fp16 this is exactly torch's
  `fp16_compress_hook` (same casts, same division, same all-reduce); bf16 works on gloo too.
- every other codec (int8, int8-block, topk, sign): encode x, pack the payloads byte-exactly
  (`pack_payload`), all-gather the packed bytes, decode every rank's payload locally and average
  them in rank order. Each rank sends (p-1) x its payload on a ring, so this only pays when the
  payload is much smaller than the fp32 gradient.
- `powersgd` (a name or a PowerSGDCodec) is distributed PowerSGD, a hook of its own
  (`geotrain.ddp.powersgd_hook`): all workers share one low-rank basis (all-reduce P, then Q).

`granularity="tensor"` (default) encodes each parameter's gradient with its own shape (per-tensor
scales and top-k), so the result does not depend on how DDP groups
parameters into buckets; `"bucket"` encodes each flat bucket as one tensor. Error-feedback
residuals are kept per parameter name in both modes, so they survive DDP's bucket rebuild after the
first iteration and a checkpoint restores into any bucket layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from geotrain.codecs import (
    Codec,
    CodecError,
    Payload,
    PowerSGDCodec,
    get_codec,
    pack_payload,
    parse_count,
    parse_flag,
    unpack_payload,
)
from geotrain.ddp.accounting import CommLedger, tensor_bytes
from geotrain.ddp.hook_target import require_ddp_model
from geotrain.ddp.powersgd_hook import PowerSGDHookState, register_powersgd_hook

GRANULARITIES = ("tensor", "bucket")


@dataclass
class CodecHookState:
    """Everything the hook keeps between calls: save it with `state_dict()`, restore with `load_state_dict()`.

    declared_bytes: sum of the payload sizes the codec declared (`payload.nbytes`) for what this rank
    handed to the process group; `ledger` counts the tensors actually handed, so the two must agree.
    iteration: backward passes completed (seeded codecs use it as their step, the same on all ranks).
    """

    codec: Codec
    process_group: Any
    world_size: int
    error_feedback: bool
    granularity: str
    param_names: dict[int, str]
    param_order: dict[str, int]
    param_sizes: dict[str, int]
    residuals: dict[str, torch.Tensor] = field(default_factory=dict)
    ledger: CommLedger = field(default_factory=CommLedger)
    declared_bytes: int = 0
    iteration: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"codec": self.codec.name, "codec_params": self.codec.params(),
                "error_feedback": self.error_feedback, "granularity": self.granularity,
                "iteration": self.iteration,
                "residuals": {name: r.clone() for name, r in self.residuals.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("codec") != self.codec.name:
            raise CodecError(f"hook state is for codec {state.get('codec')!r}, not {self.codec.name!r}")
        unknown = sorted(set(state.get("residuals", {})) - set(self.param_names.values()))
        if unknown:
            raise CodecError(f"hook state has residuals for parameters this model lacks: {unknown[:5]}")
        wrong = [name for name, r in state.get("residuals", {}).items() if r.numel() != self.param_sizes[name]]
        if wrong:
            raise CodecError(f"hook state residuals do not match the parameters' sizes: {wrong[:5]}")
        self.iteration = parse_count(state.get("iteration", 0), "hook state: iteration")  # 1.7, "3" refused
        self.residuals = {name: r.detach().cpu().clone() for name, r in state.get("residuals", {}).items()}


def register_codec_hook(ddp_model: Any, codec: Codec | str, error_feedback: bool = True, *,
                        granularity: str = "tensor", process_group: Any = None,
                        **codec_params: Any) -> CodecHookState | PowerSGDHookState:
    """Make `codec` (a Codec, or a registered name built with `codec_params`) the DDP model's
    gradient communication. Returns the hook state. Call before the first backward pass.

    `powersgd` goes to `register_powersgd_hook` (distributed PowerSGD; `codec_params` may also hold
    its hook settings start_powersgd_iter and min_compression_rate)."""
    import torch.distributed as dist

    module = require_ddp_model(ddp_model, "register_codec_hook")
    error_feedback = parse_flag(error_feedback, "register_codec_hook: error_feedback")
    if (isinstance(codec, str) and codec == "powersgd") or isinstance(codec, PowerSGDCodec):
        if granularity != "tensor":
            raise CodecError(f"powersgd compresses each parameter's matrix; granularity must be 'tensor', "
                             f"got {granularity!r}")
        instance = codec if isinstance(codec, PowerSGDCodec) else None
        if instance is not None and codec_params:
            raise CodecError(f"codec parameters {sorted(codec_params)} given with a Codec instance; pass a name instead")
        return register_powersgd_hook(ddp_model, error_feedback, process_group=process_group, codec=instance,
                                      **codec_params)
    if isinstance(codec, str):
        codec = get_codec(codec, **codec_params)
    elif codec_params:
        raise CodecError(f"codec parameters {sorted(codec_params)} given with a Codec instance; pass a name instead")
    if not isinstance(codec, Codec):
        raise CodecError(f"register_codec_hook needs a Codec or a codec name, got {type(codec).__name__}")
    if granularity not in GRANULARITIES:
        raise CodecError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    named = list(module.named_parameters())
    state = CodecHookState(codec, process_group, dist.get_world_size(process_group), error_feedback,
                           granularity, {id(param): name for name, param in named},
                           {name: index for index, (name, _) in enumerate(named)},
                           {name: param.numel() for name, param in named})
    ddp_model.register_comm_hook(state, codec_hook)
    return state


def codec_hook(state: CodecHookState, bucket):  # type: ignore[no-untyped-def]
    """The DDP hook: exchange one `dist.GradBucket` through `state.codec` (see module doc); returns a
    Future of the averaged bucket. Unannotated on purpose: DDP rejects string annotations (PEP 563)."""
    state.codec.set_step(state.iteration)
    buffer = bucket.buffer()
    units = _units(state, bucket, buffer)
    payloads = [_encode(state, unit) for unit in units]
    state.declared_bytes += sum(payload.nbytes for payload in payloads)
    if state.codec.summable:
        future = _all_reduce_payloads(state, units, payloads, buffer)
    else:
        future = _all_gather_payloads(state, units, payloads, buffer)
    if bucket.is_last():
        state.iteration += 1
    return future


@dataclass(frozen=True)
class _Unit:
    """One encoded piece of a bucket: the parameters it covers (names, sizes, offsets in the bucket
    buffer) and the tensor to encode (a gradient view, or the bucket's gradients concatenated)."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    tensor: torch.Tensor


def _units(state: CodecHookState, bucket: Any, buffer: torch.Tensor) -> list[_Unit]:
    base, itemsize = buffer.data_ptr(), buffer.element_size()
    entries = [(state.param_names[id(param)], grad, (grad.data_ptr() - base) // itemsize)
               for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True)]
    if state.granularity == "tensor":
        return [_Unit((name,), (grad.numel(),), (offset,), grad) for name, grad, offset in entries]
    # "bucket": concatenate in model parameter order, whatever order DDP's bucket holds them in, so
    # that one bucket of all parameters encodes exactly what an in-process simulation encodes.
    entries.sort(key=lambda entry: state.param_order[entry[0]])
    tensor = torch.cat([grad.reshape(-1) for _, grad, _ in entries])
    return [_Unit(tuple(e[0] for e in entries), tuple(e[1].numel() for e in entries),
                  tuple(e[2] for e in entries), tensor)]


def _encode(state: CodecHookState, unit: _Unit) -> Payload:
    """Encode the unit's tensor plus its residual; the residual (kept per parameter) becomes what was not sent."""
    if not state.error_feedback:
        return state.codec.encode(unit.tensor)
    corrected = unit.tensor.detach().clone()
    if any(name in state.residuals for name in unit.names):
        corrected += torch.cat([state.residuals[name] if name in state.residuals else torch.zeros(n)
                                for name, n in zip(unit.names, unit.sizes, strict=True)]).view_as(corrected)
    payload = state.codec.encode(corrected)
    leftover = (corrected - state.codec.decode(payload)).reshape(-1)
    for name, piece in zip(unit.names, leftover.split(list(unit.sizes)), strict=True):
        state.residuals[name] = piece.clone()
    return payload


def _scatter_into(out: torch.Tensor, unit: _Unit, values: torch.Tensor, accumulate: bool) -> None:
    """Write (or add) a unit's decoded values to their parameters' places in the bucket buffer."""
    for offset, piece in zip(unit.offsets, values.reshape(-1).split(list(unit.sizes)), strict=True):
        target = out[offset:offset + piece.numel()]
        if accumulate:
            target += piece
        else:
            target.copy_(piece)


def _all_reduce_payloads(state: CodecHookState, units: list[_Unit], payloads: list[Payload],
                         buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    import torch.distributed as dist

    wire = torch.cat([t.reshape(-1) for payload in payloads for t in payload.buffers.values()])
    wire.div_(state.world_size)  # before the sum, in the wire dtype (as torch's fp16 hook: no overflow)
    state.ledger.record("all_reduce", tensor_bytes(wire), state.world_size)
    work = dist.all_reduce(wire, group=state.process_group, async_op=True)

    def finish(_: Any) -> torch.Tensor:
        start = 0
        for unit, payload in zip(units, payloads, strict=True):
            summed, start = _with_buffers(payload, wire, start)
            _scatter_into(buffer, unit, state.codec.decode(summed), accumulate=False)
        return buffer

    return work.get_future().then(finish)


def _all_gather_payloads(state: CodecHookState, units: list[_Unit], payloads: list[Payload],
                         buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    import torch.distributed as dist

    specs = [payload.spec() for payload in payloads]
    mine = torch.cat([pack_payload(payload) for payload in payloads])
    gathered = torch.empty(state.world_size * mine.numel(), dtype=torch.uint8)
    state.ledger.record("all_gather", tensor_bytes(mine), state.world_size)
    work = dist.all_gather_single(gathered, mine, group=state.process_group, async_op=True)

    def finish(_: Any) -> torch.Tensor:
        total = torch.zeros_like(buffer)
        for rank_bytes in gathered.view(state.world_size, -1):  # rank order: a deterministic sum
            start = 0
            for unit, spec in zip(units, specs, strict=True):
                payload = unpack_payload(rank_bytes[start:start + spec.nbytes], spec)
                _scatter_into(total, unit, state.codec.decode(payload), accumulate=True)
                start += spec.nbytes
        buffer.copy_(total.div_(state.world_size))
        return buffer

    return work.get_future().then(finish)


def _with_buffers(payload: Payload, flat: torch.Tensor, start: int) -> tuple[Payload, int]:
    """`payload` with its buffers replaced by the next slices of the summed flat wire tensor."""
    buffers = {}
    for name, t in payload.buffers.items():
        buffers[name] = flat[start:start + t.numel()].view(t.shape)
        start += t.numel()
    return Payload(payload.codec, buffers, payload.shape, payload.dtype, payload.meta), start
