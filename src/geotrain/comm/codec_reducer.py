"""Any geotrain codec as a reducer: each worker encodes its gradients (plus its error-feedback
residual), the group averages what the codec delivers.

How one call is exchanged (per local worker; x = gradient + residual):
- summable codecs (none, fp16, bf16, randk): encode x, divide the wire buffers by the world size in
  their own dtype, all-reduce (sum) them in one flat buffer, decode. For fp16 this is exactly torch's
  `fp16_compress_hook` (same casts, same division, same all-reduce).
- every other codec (int8, int8-block, topk, sign, powersgd as a per-worker codec): encode x, pack
  the payloads byte-exactly (`pack_payload`), all-gather the packed bytes, decode every rank's payload
  and sum them in rank order (so every rank gets bit-identical results), divide by the world size.
  Each rank sends (p-1) x its payload, on a ring or (given the group's links) in one direct all-to-all
  round where that is faster (geotrain.comm.gather): this only pays when the payload is much smaller
  than the fp32 gradient.

`granularity`: "tensor" encodes each tensor with its own shape (per-tensor scales, top-k, low rank),
"flat" encodes the call's tensors concatenated (in the order given) as one vector. Residuals are kept
per tensor name and local worker in both modes, so a DDP bucket rebuild or a checkpoint restored into
another bucket layout changes nothing. Bytes: `declared_bytes` sums the payload sizes one worker
declared (`payload.nbytes`); the collective's ledger counts what was handed, and the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.codecs import Codec, CodecError, Payload, pack_payload, unpack_payload
from geotrain.comm.collectives import Collective
from geotrain.comm.gather import GatherLinks

GRANULARITIES = ("tensor", "flat")


def gather_by_links(gather: Callable[..., Any], packed: list[torch.Tensor], links: GatherLinks | None) -> Any:
    """`gather(packed)` (a collective's all_gather or start_all_gather) by the algorithm the group's
    `links` choose for this payload size (the same on every rank); the ring is the collective's
    default, so collectives without the `algorithm` argument serve groups without links (None)."""
    if links is None:
        return gather(packed)
    algorithm = links.algorithm(packed[0].numel() * packed[0].element_size())
    return gather(packed) if algorithm == "ring" else gather(packed, algorithm=algorithm)


class CodecReducer:
    """Averages named tensors of `local_workers` of the group's workers through `codec` (see module doc)."""

    whole_model = False
    """Any subset of the tensors may be reduced in one call (a DDP hook reduces bucket by bucket)."""

    def __init__(self, codec: Codec, named_shapes: Sequence[tuple[str, Sequence[int]]], world_size: int,
                 local_workers: int = 1, error_feedback: bool = True, granularity: str = "flat",
                 gather_links: GatherLinks | None = None) -> None:
        """`gather_links`: the group's links; each gathered exchange then takes the algorithm
        `gather_links.algorithm(payload bytes)` chooses (geotrain.comm.gather); None: the ring."""
        if granularity not in GRANULARITIES:
            raise CodecError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        if world_size < 1 or not 1 <= local_workers <= world_size:
            raise ValueError(f"need 1 <= local_workers <= world_size, got {local_workers} and {world_size}")
        codec.warm_up()  # its kernels load here, not inside the first exchange (timed as training)
        self.codec = codec
        self.name = codec.name
        self.names = tuple(name for name, _ in named_shapes)
        self.sizes = {name: int(torch.Size(shape).numel()) for name, shape in named_shapes}
        self.world_size = world_size
        self.local_workers = local_workers
        self.error_feedback = error_feedback
        self.granularity = granularity
        self.residuals: list[dict[str, torch.Tensor]] = [{} for _ in range(local_workers)]
        self.declared_bytes = 0
        self.gather_links = gather_links

    def reduce(self, worker_grads: Sequence[Sequence[torch.Tensor]], collective: Collective, step: int,
               names: Sequence[str] | None = None) -> list[torch.Tensor]:
        """`worker_grads[w][i]`: local worker w's tensor named `names[i]` (default: every name, in order).
        Returns the group mean of each tensor (as the codec delivers it), in the tensors' shapes."""
        payloads, template = self.encode_all(worker_grads, step, names)
        if self.codec.summable:
            decoded = self._decode_summed(collective.all_reduce_sum(self._summable_wires(payloads)), payloads[0])
        else:
            specs = [payload.spec() for payload in payloads[0]]
            decoded = self.decode_gathered(self._gather(collective.all_gather, self.packed(payloads)), specs)
        return self.unflatten(decoded, template)

    def start(self, worker_grads: Sequence[Sequence[torch.Tensor]], collective: Any, step: int,
              names: Sequence[str] | None = None) -> Callable[[], list[torch.Tensor]]:
        """`reduce` in two halves: encode and post the collective now (`collective.start_all_gather` /
        `start_all_reduce_sum`), return a function that waits, decodes and returns the means."""
        payloads, template = self.encode_all(worker_grads, step, names)
        if self.codec.summable:
            posted = collective.start_all_reduce_sum(self._summable_wires(payloads))
            return lambda: self.unflatten(self._decode_summed(posted.wait(), payloads[0]), template)
        specs = [payload.spec() for payload in payloads[0]]
        posted = self._gather(collective.start_all_gather, self.packed(payloads))
        return lambda: self.unflatten(self.decode_gathered(posted.wait(), specs), template)

    def encode_all(self, worker_grads: Sequence[Sequence[torch.Tensor]], step: int,
                   names: Sequence[str] | None) -> tuple[list[list[Payload]], Sequence[torch.Tensor]]:
        """Each local worker's payloads (one per unit: each tensor, or all flat) of `worker_grads` plus its
        residuals, and the first worker's tensors (the shapes and dtypes `unflatten` restores)."""
        names = self.names if names is None else tuple(names)
        if len(worker_grads) != self.local_workers or any(len(g) != len(names) for g in worker_grads):
            raise ValueError(f"expected {self.local_workers} local worker(s) x {len(names)} tensors")
        self.codec.set_step(step)  # seeded codecs (randk) agree on their randomness per step
        units = [(i,) for i in range(len(names))] if self.granularity == "tensor" else [tuple(range(len(names)))]
        payloads = [[self._encode(w, [names[i] for i in unit], [grads[i] for i in unit]) for unit in units]
                    for w, grads in enumerate(worker_grads)]
        self.declared_bytes += sum(payload.nbytes for payload in payloads[0])
        return payloads, worker_grads[0]

    @staticmethod
    def unflatten(decoded: list[torch.Tensor], template: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The decoded units cut back into the template's tensors (shapes and dtypes)."""
        flat = torch.cat([d.reshape(-1) for d in decoded]) if decoded else torch.zeros(0)
        return [piece.view(t.shape).to(t.dtype) for piece, t in
                zip(flat.split([t.numel() for t in template]), template, strict=True)]

    def _encode(self, worker: int, names: list[str], tensors: list[torch.Tensor]) -> Payload:
        """Encode the unit (one tensor, or several flattened and concatenated) plus its residual; the
        residual (kept per name) becomes what the payload does not carry."""
        x = tensors[0].detach() if len(tensors) == 1 else torch.cat([t.detach().reshape(-1) for t in tensors])
        if not self.error_feedback or self.codec.exact:  # an exact codec leaves nothing behind
            return self.codec.encode(x)
        x = x.clone()
        residuals = self.residuals[worker]
        if any(name in residuals for name in names):
            x += torch.cat([residuals.get(name, torch.zeros(self.sizes[name])) for name in names]).view_as(x)
        payload = self.codec.encode(x)
        leftover = (x - self.codec.decode(payload)).reshape(-1)
        for name, piece in zip(names, leftover.split([self.sizes[name] for name in names]), strict=True):
            residuals[name] = piece.clone()
        return payload

    def _summable_wires(self, payloads: list[list[Payload]]) -> list[torch.Tensor]:
        # divided before the sum, in the wire dtype (no fp16 overflow)
        return [torch.cat([t.reshape(-1) for p in worker for t in p.buffers.values()]).div_(self.world_size)
                for worker in payloads]

    def _decode_summed(self, total: torch.Tensor, payloads: list[Payload]) -> list[torch.Tensor]:
        decoded, start = [], 0
        for payload in payloads:
            buffers = {}
            for name, t in payload.buffers.items():
                buffers[name] = total[start:start + t.numel()].view(t.shape)
                start += t.numel()
            summed = Payload(payload.codec, buffers, payload.shape, payload.dtype, payload.meta)
            decoded.append(self.codec.decode(summed))
        return decoded

    def _gather(self, gather: Callable[..., Any], packed: list[torch.Tensor]) -> Any:
        return gather_by_links(gather, packed, self.gather_links)

    @staticmethod
    def packed(payloads: list[list[Payload]]) -> list[torch.Tensor]:
        """Per local worker, its payloads packed byte-exactly into one uint8 buffer."""
        return [torch.cat([pack_payload(p) for p in worker]) for worker in payloads]

    def decode_gathered(self, gathered: torch.Tensor, specs: list[Any]) -> list[torch.Tensor]:
        """The group mean per unit of gathered packed payloads (every rank's, rank after rank; or a
        (world size, bytes) view), decoded and summed in rank order."""
        gathered = gathered.reshape(self.world_size, -1)
        totals: list[torch.Tensor | None] = [None] * len(specs)
        for rank_bytes in gathered:  # rank order: a deterministic sum
            start = 0
            for k, spec in enumerate(specs):
                value = self.codec.decode(unpack_payload(rank_bytes[start:start + spec.nbytes], spec))
                totals[k] = value.clone() if totals[k] is None else totals[k].add_(value)
                start += spec.nbytes
        return [total.div_(self.world_size) for total in totals]  # type: ignore[union-attr]

    def state_dict(self) -> dict[str, Any]:
        """Codec, settings and each local worker's residuals per tensor name (copies)."""
        return {"codec": self.codec.name, "codec_params": self.codec.params(), "error_feedback": self.error_feedback,
                "granularity": self.granularity,
                "residuals": [{name: r.clone() for name, r in worker.items()} for worker in self.residuals]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the residuals; CodecError if the state is another codec's or does not fit the tensors."""
        if state.get("codec") != self.codec.name:
            raise CodecError(f"reducer state is for codec {state.get('codec')!r}, not {self.codec.name!r}")
        if bool(state.get("error_feedback")) != self.error_feedback:
            raise CodecError("checkpoint and run disagree on error feedback (on in one, off in the other)")
        residuals = state.get("residuals", [])
        if len(residuals) != self.local_workers:
            raise CodecError(f"reducer state holds {len(residuals)} workers' residuals, expected {self.local_workers}")
        for worker in residuals:
            unknown = sorted(set(worker) - set(self.sizes))
            if unknown:
                raise CodecError(f"reducer state has residuals for tensors this model lacks: {unknown[:5]}")
            wrong = [name for name, r in worker.items() if r.numel() != self.sizes[name]]
            if wrong:
                raise CodecError(f"reducer state residuals do not match the tensors' sizes: {wrong[:5]}")
        self.residuals = [{name: r.detach().cpu().reshape(-1).clone() for name, r in worker.items()}
                          for worker in residuals]


