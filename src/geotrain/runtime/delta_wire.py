"""AQ-SGD-style per-sample activation deltas on a pipeline cut (Wang et al. 2022, "Fine-tuning language
models over slow networks using activation quantization with guarantees").

Both sides of the cut keep, per training sample i (its window identity, geotrain.data.window_ids), the
last activation the receiver reconstructed, m_i. A sample seen before crosses as a quantised delta:

    sender:   q = Q(a_i - m_i);  m_i += D(q)          receiver:   m_i += D(q);  activations = m_i

so both m_i stay bit-identical and the error of D(Q(.)) applies to the change since the last epoch, which
shrinks as training converges. A sample seen for the first time crosses at a higher-precision codec
(`first`): m_i = D_first(Q_first(a_i)). Activation gradients are quantised directly by `grad` (no delta:
they change sign and size from epoch to epoch). Evaluation (no gradient) sends `first` and touches no state.

With `feedback=true` the gradients get per-sample error feedback: the receiver keeps, per sample, what `grad`
dropped of its gradient, e_i, and adds it to the sample's gradient at its next visit (an epoch later):

    receiver:   c = g_i + e_i;  q = Q_grad(c);  e_i = c - D_grad(q)          sender:   gradient = D_grad(q)

so what the sender has received of sample i's gradients plus e_i is every gradient the receiver computed for
it: a biased 1-bit code's error is paid back instead of pushing training the same way visit after visit
(EF-SGD, Karimireddy et al. 2019). Only the receiver keeps e_i (the sender decodes what arrives).

torch.distributed.pipelining sends one fixed carrier shape per stage, so the choice is made per step, which
both sides know before it runs: a step whose samples were all seen is *narrow* (every row a delta), a
step with any first sight is *wide* (every row at `first`, its seen samples refreshed too). The worker
holds one pipeline per width. Carrier row (float32): [sample id as int32 bits | payload padded to 4 bytes],
its width the larger of the forward codec's payload and `grad`'s (the gradient travels back in the same
shape). The ids come from the deterministic rule both stages compute (the step's windows, micro-batches
in order); the carried id checks it (a mismatch is an error, not a silent drift).

Memory: m_i is float32, prod(sample shape) x 4 bytes per sample on each side (the tiny GPT at context 96:
96 x 128 x 4 = 49,152 bytes), twice that on the receiver with `feedback` (e_i); a run of N samples may keep N
times that per side, refused above `max_state_mb` (geotrain.codecs.delta: the spec, its steady-state bytes and the
memory rule).

Checkpoints: each side's memory is in its rank's shard (`cut`: the ids and their m_i; as many bytes again as the
memory), and `--resume` loads it, so the resumed run sends what the uninterrupted one sends (deltas, not a second
round of first sights). Both sides of a cut load their own replica's memories, which were equal when written; the
receiver's shard holds its gradient residuals too (`residual_ids`, `residual_values`: DeltaWire.state_dict).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from geotrain.codecs import Codec, CodecSpec, PayloadSpec
from geotrain.codecs.carrier import carried_spec, carrier_numel, decode_from_carrier, encode_to_carrier
from geotrain.codecs.delta import DeltaSpec, is_delta

NO_SAMPLE = -1
"""The carried id of a row that belongs to no training sample (evaluation): no state read or written."""


def delta_wire_refusal(config: Any) -> str | None:
    """The one line refusing a RuntimeConfig's delta --pp-codec where sample identity or the state's life is not
    what the wire needs (None: it runs, or no cut uses it)."""
    comm = config.comm
    specs = [spec for spec in (comm.pp_codecs or (comm.pp_codec,)) if is_delta(spec)]
    if not specs:
        return None
    shown = f"--pp-codec {specs[0]}"
    if config.stages != 2 or config.stages_per_rank != 1:
        return (f"{shown} with {config.stages} stages of {config.stages_per_rank} virtual stages each: not built "
                f"yet: one cut (2 stages, one virtual stage per rank), each rank one side of it")
    if config.data.windows == "random":
        return (f"{shown} with --windows random: every start offset is a sample, seen about once, so per-sample "
                f"deltas never start; use --windows epochs")
    if config.reliability.elastic:
        return f"{shown} with --elastic: not built yet: a rejoining group has no per-sample state"
    if config.schedule.batch_shares == "measured":
        return f"{shown} with --batch-shares measured: not built yet: a rebalance rebuilds the pipeline of one width"
    if config.shards is not None:
        return f"{shown} with sharded slots: not built yet: a shard sends part of the replica's samples"
    return None


class DeltaMemory:
    """One side's per-sample state: sample id -> m_i (float32, the sample's shape)."""

    def __init__(self) -> None:
        self.values: dict[int, torch.Tensor] = {}

    def all_seen(self, samples: Sequence[int]) -> bool:
        return all(int(i) in self.values for i in samples)

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.values.values())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The memory for a checkpoint: `ids` (int64, ascending) and `values` (float32, one row per id)."""
        ids = sorted(self.values)
        values = torch.stack([self.values[i] for i in ids]) if ids else torch.zeros(0)
        return {"ids": torch.tensor(ids, dtype=torch.int64), "values": values}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Replace the memory by a `state_dict`'s (ValueError when its ids and values do not pair up)."""
        ids, values = state["ids"], state["values"]
        if ids.dim() != 1 or (ids.numel() and values.shape[0] != ids.numel()):
            raise ValueError(f"delta wire state: {ids.numel()} sample ids but {tuple(values.shape)} values")
        self.values = {int(i): values[row].clone() for row, i in enumerate(ids.tolist())}


def encode_rows(memory: DeltaMemory | None, ids: Sequence[int], hidden: torch.Tensor, codec: Codec,
                absolute: bool) -> torch.Tensor:
    """The sender's side: (B, carrier_numel(codec)) float32 carrying each row of `hidden` (batch first) as
    codec(a_i) (`absolute`) or codec(a_i - m_i); `memory` (None: evaluation, nothing kept) takes the value
    the receiver will reconstruct."""
    spec = carried_spec(codec, hidden.shape[1:])
    values = hidden.detach().float().cpu()
    if not absolute:
        values = values - torch.stack([memory.values[int(i)] for i in ids])
    carrier = encode_to_carrier(codec, values)
    if memory is not None:
        _apply(memory, ids, decode_from_carrier(codec, carrier, spec), absolute)
    return carrier


def decode_rows(memory: DeltaMemory | None, ids: Sequence[int], carrier: torch.Tensor, codec: Codec,
                sample_shape: Sequence[int], absolute: bool) -> torch.Tensor:
    """The receiver's side: the activations (B, *sample_shape) a carrier of `encode_rows` holds, float32 on CPU."""
    decoded = decode_from_carrier(codec, carrier.cpu(), carried_spec(codec, sample_shape))
    if memory is None:
        return decoded
    _apply(memory, ids, decoded, absolute)
    return torch.stack([memory.values[int(i)] for i in ids])


def _apply(memory: DeltaMemory, ids: Sequence[int], decoded: torch.Tensor, absolute: bool) -> None:
    """m_i = decoded (first sight) or m_i += decoded (delta): the one update both sides run."""
    for row, sample in enumerate(ids):
        key = int(sample)
        memory.values[key] = decoded[row].clone() if absolute else memory.values[key] + decoded[row]


def _ids_column(ids: Sequence[int]) -> torch.Tensor:
    return torch.tensor([int(i) for i in ids], dtype=torch.int32).view(torch.float32).unsqueeze(1)


def _carried_ids(carrier: torch.Tensor) -> np.ndarray:
    return carrier[:, :1].detach().cpu().contiguous().view(torch.int32).squeeze(1).numpy().astype(np.int64)


class DeltaWire:
    """The delta wire of one cut, one side per process (the sender's stage or the receiver's): explicit state
    (`memory`), told each training step's sample ids (`begin_step`) before the schedule runs."""

    def __init__(self, spec: CodecSpec) -> None:
        self.spec = spec
        self.delta = DeltaSpec.of(spec)
        self.codec, self.first, self.grad = (self.delta.codec_spec(key).build() for key in ("codec", "first", "grad"))
        self.memory = DeltaMemory()
        self.residuals = DeltaMemory()
        """Per-sample gradient residuals e_i (`feedback`; the receiver's side only)."""
        self.wide = True
        self._ids: np.ndarray = np.zeros(0, dtype=np.int64)
        self._next = 0

    def __str__(self) -> str:
        return str(self.spec)

    def carrier_shape(self, shape: tuple[int, ...], wide: bool = False) -> tuple[int, ...]:
        """The carrier's shape for activations of `shape` (batch first) in a narrow or a wide step."""
        forward = self.first if wide else self.codec
        body = max(carrier_numel(forward, shape[1:]), carrier_numel(self.grad, shape[1:]))
        return (shape[0], 1 + body)

    def begin_step(self, ids: Sequence[int]) -> bool:
        """Start a training step on samples `ids` (this replica's windows, in batch order); returns whether the
        step is wide (some sample not seen yet): both sides of the cut compute the same answer."""
        self._ids, self._next = np.asarray(ids, dtype=np.int64), 0
        self.wide = not self.memory.all_seen(self._ids)
        return self.wide

    def _take(self, rows: int) -> np.ndarray:
        ids = self._ids[self._next:self._next + rows]
        if len(ids) != rows:
            raise RuntimeError(f"delta wire: {rows} rows past the step's {len(self._ids)} samples (begin_step missing)")
        self._next += rows
        return ids

    def send(self, hidden: torch.Tensor) -> torch.Tensor:
        """`hidden` (batch first) as a carrier; its gradient is decoded from the carrier's gradient."""
        return _Send.apply(hidden, self, torch.is_grad_enabled())

    def receive(self, carrier: torch.Tensor, sample_shape: tuple[int, ...]) -> torch.Tensor:
        """The activations a carrier holds (batch, *sample_shape); their gradient goes back by `grad`."""
        return _Receive.apply(carrier, self, tuple(sample_shape), torch.is_grad_enabled())

    def encode_forward(self, hidden: torch.Tensor, training: bool) -> torch.Tensor:
        """The sender: training rows as deltas (narrow) or at `first` (wide); evaluation (not `training`) at
        `first`, no state."""
        ids = self._take(hidden.shape[0]) if training else np.full(hidden.shape[0], NO_SAMPLE)
        absolute = self.wide or not training
        body = encode_rows(self.memory if training else None, ids, hidden, self.first if absolute else self.codec,
                           absolute)
        width = self.carrier_shape(tuple(hidden.shape), wide=absolute)[1]
        return self._frame(_ids_column(ids), body, width, hidden.device)

    def decode_forward(self, carrier: torch.Tensor, sample_shape: tuple[int, ...], training: bool) -> torch.Tensor:
        """The receiver: the inverse of `encode_forward`, checking the carried ids against the step's."""
        carried = _carried_ids(carrier)
        if training:
            expected = self._take(carrier.shape[0])
            if not np.array_equal(carried, expected):
                raise RuntimeError(f"delta wire: the sender sent samples {carried.tolist()}, this stage expected "
                                   f"{expected.tolist()} (the two stages disagree on the step's windows)")
        absolute = self.wide or not training
        codec = self.first if absolute else self.codec
        body = carrier[:, 1:1 + carrier_numel(codec, sample_shape)]
        out = decode_rows(self.memory if training else None, carried, body, codec, sample_shape, absolute)
        return out.to(carrier.device)

    def encode_gradient(self, grad: torch.Tensor, width: int, ids: Sequence[int]) -> torch.Tensor:
        """The receiver's backward: the activation gradient of samples `ids` at `grad`, in a carrier `width` floats
        wide (the forward carrier's shape, as torch's schedule expects); with `feedback`, each row's residual is
        added before coding and replaced by what the code dropped (rows of NO_SAMPLE keep none)."""
        values = grad.detach().float().cpu()
        keep = self.delta.feedback and all(int(i) != NO_SAMPLE for i in ids)
        if keep:
            zero = torch.zeros(values.shape[1:])
            values = values + torch.stack([self.residuals.values.get(int(i), zero) for i in ids])
        body = encode_to_carrier(self.grad, values)
        if keep:
            sent = decode_from_carrier(self.grad, body, carried_spec(self.grad, values.shape[1:]))
            for row, sample in enumerate(ids):
                self.residuals.values[int(sample)] = values[row] - sent[row]
        return self._frame(torch.zeros(grad.shape[0], 1), body, width, grad.device)

    def decode_gradient(self, carrier: torch.Tensor, sample_shape: tuple[int, ...]) -> torch.Tensor:
        """The sender's backward: the activation gradient (B, *sample_shape) a carrier of `encode_gradient` holds."""
        spec: PayloadSpec = carried_spec(self.grad, sample_shape)
        return decode_from_carrier(self.grad, carrier[:, 1:1 + carrier_numel(self.grad, sample_shape)], spec)

    def _frame(self, ids: torch.Tensor, body: torch.Tensor, width: int, device: torch.device) -> torch.Tensor:
        pad = torch.zeros(body.shape[0], width - 1 - body.shape[1])
        return torch.cat([ids, body.cpu(), pad], dim=1).to(device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This side's state for a checkpoint: the memory's (`ids`, `values`) and, with `feedback`, the gradient
        residuals' (`residual_ids`, `residual_values`; empty on the sender)."""
        state = self.memory.state_dict()
        if self.delta.feedback:
            state.update({f"residual_{key}": value for key, value in self.residuals.state_dict().items()})
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a `state_dict` (KeyError when `feedback` is on and it holds no residuals)."""
        self.memory.load_state_dict({"ids": state["ids"], "values": state["values"]})
        if self.delta.feedback:
            self.residuals.load_state_dict({"ids": state["residual_ids"], "values": state["residual_values"]})

    def state_summary(self) -> dict[str, Any]:
        """What this side keeps: samples, bytes and a digest (equal on both sides of the cut); with `feedback`, the
        gradient residuals' samples and digest too (the receiver's; none on the sender)."""
        residuals = {"residual_samples": len(self.residuals.values),
                     "residual_fingerprint": fingerprint(self.residuals)} if self.delta.feedback else {}
        return {"samples": len(self.memory.values), "state_bytes": self.memory.nbytes(),
                "fingerprint": fingerprint(self.memory), **residuals}


def fingerprint(memory: DeltaMemory) -> float:
    """A float64 digest of a memory (ids and values): equal memories give equal digests."""
    return float(sum((i + 1) * float(v.double().sum()) for i, v in sorted(memory.values.items())))


class _Send(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, wire: DeltaWire,  # type: ignore[override]
                training: bool) -> torch.Tensor:
        ctx.wire, ctx.sample_shape = wire, tuple(hidden.shape[1:])
        return wire.encode_forward(hidden, training)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        return ctx.wire.decode_gradient(grad, ctx.sample_shape).to(grad.device), None, None


class _Receive(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, carrier: torch.Tensor, wire: DeltaWire,  # type: ignore[override]
                sample_shape: tuple[int, ...], training: bool) -> torch.Tensor:
        ctx.wire, ctx.width, ctx.ids = wire, carrier.shape[1], _carried_ids(carrier)
        return wire.decode_forward(carrier, sample_shape, training)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        return ctx.wire.encode_gradient(grad, ctx.width, ctx.ids), None, None, None
