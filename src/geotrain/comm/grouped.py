"""Several codecs in one collective: `GroupedCodecReducer`.

Some exchanges carry tensors that want different codecs: an outer sync that also averages Adam's
moments (geotrain.sync.moments) sends the outer gradients and the first moment through the run's codec
with error feedback, and the second moment through `log-block` without it. Three collectives would pay
the links' latency three times; this reducer pays it once. Each part is a CodecReducer over a
consecutive slice of the call's tensors; every worker packs all parts' payloads into one buffer, the
group gathers those buffers in one collective (by the algorithm the group's links choose for their
size, geotrain.comm.gather), and each part decodes and averages its own columns in rank order.
Summable codecs (none, fp16) are gathered too, so the mean is the same sum in rank order on every rank.
A call may send only the first `parts` parts (the others' tensors left out of it, their residuals kept):
moment sync's later syncs send the outer gradients alone (geotrain.sync.streaming, `moment_syncs`); every
worker of the group must pass the same count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.codecs import CodecError
from geotrain.comm.codec_reducer import CodecReducer, gather_by_links
from geotrain.comm.collectives import Collective
from geotrain.comm.gather import GatherLinks


class GroupedCodecReducer:
    """CodecReducers over consecutive slices of one call's tensors, exchanged in one all-gather (module doc)."""

    whole_model = True
    """Every call reduces all the tensors, in order (the parts cut them by position)."""

    def __init__(self, parts: Sequence[CodecReducer], gather_links: GatherLinks | None = None) -> None:
        parts = list(parts)
        if not parts:
            raise CodecError("GroupedCodecReducer needs at least one part")
        if len({part.world_size for part in parts}) != 1 or any(part.local_workers != 1 for part in parts):
            raise CodecError("GroupedCodecReducer: every part must have the same world size and one local worker")
        names = [name for part in parts for name in part.names]
        if len(set(names)) != len(names):
            raise CodecError("GroupedCodecReducer: the parts' tensor names must differ")
        self.parts = parts
        self.names = tuple(names)
        self.world_size = parts[0].world_size
        self.gather_links = gather_links
        self.name = "+".join(part.name for part in parts)

    @property
    def declared_bytes(self) -> int:
        """The bytes every part's codec declared for this worker's payloads so far."""
        return sum(part.declared_bytes for part in self.parts)

    def reduce(self, worker_grads: Sequence[Sequence[torch.Tensor]], collective: Collective, step: int,
               names: Sequence[str] | None = None, parts: int | None = None) -> list[torch.Tensor]:
        """The group mean of every tensor (worker_grads[0][i] is the tensor named names[i]), each part
        through its codec, in one all-gather; `parts`: only the first `parts` parts travel (worker_grads
        then holds their tensors alone, and so do the means; None: all)."""
        packed, decode = self._encode(worker_grads, step, names, parts)
        return decode(gather_by_links(collective.all_gather, packed, self.gather_links))

    def start(self, worker_grads: Sequence[Sequence[torch.Tensor]], collective: Any, step: int,
              names: Sequence[str] | None = None, parts: int | None = None) -> Callable[[], list[torch.Tensor]]:
        """`reduce` in two halves: encode and post the all-gather now, return a function that waits,
        decodes and returns the means."""
        packed, decode = self._encode(worker_grads, step, names, parts)
        posted = gather_by_links(collective.start_all_gather, packed, self.gather_links)
        return lambda: decode(posted.wait())

    def _encode(self, worker_grads: Sequence[Sequence[torch.Tensor]], step: int, names: Sequence[str] | None,
                parts: int | None) -> tuple[list[torch.Tensor], Callable[[torch.Tensor], list[torch.Tensor]]]:
        if parts is None:
            parts = len(self.parts)
        if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= len(self.parts):
            raise ValueError(f"parts must be an integer in 1..{len(self.parts)}, got {parts!r}")
        travelling = self.parts[:parts]
        count = sum(len(part.names) for part in travelling)
        if names is not None and tuple(names) != self.names[:count]:
            raise ValueError("GroupedCodecReducer reduces its first parts' tensors in order in every call")
        if len(worker_grads) != 1 or len(worker_grads[0]) != count:
            raise ValueError(f"expected 1 local worker x {count} tensors (the first {parts} part(s))")
        tensors = list(worker_grads[0])
        encoded, start = [], 0
        for part in travelling:
            piece = tensors[start:start + len(part.names)]
            start += len(part.names)
            payloads, template = part.encode_all([piece], step, None)
            encoded.append((part, payloads, template))
        packed = [torch.cat([part.packed(payloads)[0] for part, payloads, _ in encoded])]
        layout = [(part, [p.spec() for p in payloads[0]], template) for part, payloads, template in encoded]

        def decode(gathered: torch.Tensor) -> list[torch.Tensor]:
            rows = gathered.reshape(self.world_size, -1)
            means, column = [], 0
            for part, specs, template in layout:
                width = sum(spec.nbytes for spec in specs)
                means += part.unflatten(part.decode_gathered(rows[:, column:column + width], specs), template)
                column += width
            return means

        return packed, decode

    def state_dict(self) -> dict[str, Any]:
        """Every part's state (codec, settings, residuals), in order."""
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore every part's state; CodecError if the state holds other parts."""
        saved = state.get("parts")
        if not isinstance(saved, list) or len(saved) != len(self.parts):
            raise CodecError(f"reducer state holds {len(saved) if isinstance(saved, list) else 'no'} part(s), "
                             f"this exchange has {len(self.parts)} ({self.name})")
        for part, part_state in zip(self.parts, saved, strict=True):
            part.load_state_dict(part_state)
