"""Moment sync: at each outer sync the replicas also average their inner AdamW's two moments.

Local SGD / DiLoCo leaves each replica's AdamW state its own: the first moment m of its own (noisier,
1/R of the batch) gradients and the second moment v of their squares. Averaging the parameters of R
AdamW steps taken with R different denominators is not a step on the mean gradient, and on bench wan's
tiny GPT that costs +0.033 nats at step 60 against DDP even when the weights are averaged after every
step (docs/history/wan.md). With the moments averaged too, every outer period starts from one optimizer state on
every replica: the same run ends at 2.2759 against DDP's 2.2770 (docs/history/diloco.md, "Moment sync").

What travels, per fragment, in the outer sync's one collective (geotrain.comm.grouped), each as its own
part after the outer gradients (`moment_parts`):
- the first moment as a delta from its anchor (the mean agreed at the last sync; zeros at the start,
  as AdamW's state starts), through the outer codec with its error feedback, like the outer gradients;
- the second moment as values through `log-block` (4 bits: a sign and a log-spaced magnitude, within a
  relative bound; v spans ten decades, and blockwise int8 turns its small values into zeros, which the
  update divides by), without error feedback; through `none` when the outer codec is uncompressed.

Landing, as the parameters land (geotrain.sync.streaming): blocking, each replica's moments become the
means; with the mix rule, mix x local + (1 - mix) x mean; eagerly, each moment moves by (mean - what
this replica sent), keeping the overlapped steps' own updates. The second moment is kept >= 0.
AdamW's step count is the same on every replica and is not sent.

Sharded parameters (FSDP2 / DTensor, geotrain.optim.shards): a DTensor parameter's moments are DTensors sharded
as it is; the shadows, anchors and landings hold their local shards, so each shard's moments average with the same
shard's peers on the sync's group, as its outer gradients do.

Moments in the first syncs only (`moment_syncs` N): each fragment's first N outer syncs carry the moments,
later ones the outer gradients alone (the exchange sends its first part only; the moments' residuals are
kept). Measured in benchmarks/moment_sync_sim.py (3 seeds, docs/history/diloco.md): with N = 1 or 2 the run ends as
well as with every sync carrying them, or better, and an overlapped sync after the warm-up is a third as
large (int4-block: 0.53 instead of 1.62 bytes per parameter).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from geotrain.codecs import CodecSpec
from geotrain.optim.outer_state import on_state, state_device
from geotrain.optim.shards import local_shard
from geotrain.sync.base import SyncError, grad_carrier
from geotrain.sync.exchange import ExtraTensors

SECOND_MOMENT_CODEC = "log-block"

NamedParams = list[tuple[str, torch.nn.Parameter]]
MomentTensors = tuple[NamedParams, NamedParams]
"""A fragment's moment shadows: (first moments, second moments), named (MomentSync.named_first/second)."""


def second_moment_codec(outer_codec: CodecSpec) -> CodecSpec:
    """How the second moment travels beside outer gradients sent through `outer_codec` (module doc)."""
    return CodecSpec.uncompressed() if outer_codec.is_uncompressed else CodecSpec.parse(SECOND_MOMENT_CODEC)


PARTS_WITH_MOMENTS = 3
"""An exchange's parts when the moments travel: the outer gradients, then `moment_parts`' two."""


def moment_parts(moments: MomentTensors, outer_codec: CodecSpec, error_feedback: bool) -> list[ExtraTensors]:
    """The exchange parts (geotrain.sync.exchange.StageExchange's `extra`) that carry `moments` after the outer
    gradients: the first moment through `outer_codec` (with `error_feedback`), the second through
    `second_moment_codec` without it."""
    first, second = moments
    return [ExtraTensors(first, outer_codec, error_feedback), ExtraTensors(second, second_moment_codec(outer_codec), False)]


def check_moment_optimizer(optimizer: torch.optim.Optimizer, where: str) -> None:
    """SyncError unless `optimizer` is torch's Adam or AdamW without amsgrad (the moments this sync averages)."""
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        raise SyncError(f"{where}: sync_moments averages Adam's moments (exp_avg, exp_avg_sq); the inner optimizer "
                        f"is {type(optimizer).__name__}, use torch.optim.AdamW or Adam")
    if any(group.get("amsgrad") for group in optimizer.param_groups):
        raise SyncError(f"{where}: sync_moments with amsgrad is not supported (its running maximum stays local)")


def check_moment_syncs(moment_syncs: int | None, sync_moments: bool) -> None:
    """SyncError (one line) unless `moment_syncs` is None or an integer >= 1 with `sync_moments` (module doc)."""
    if moment_syncs is not None and (isinstance(moment_syncs, bool) or not isinstance(moment_syncs, int)
                                     or moment_syncs < 1 or not sync_moments):
        raise SyncError(f"moment_syncs (how many of each fragment's first outer syncs carry the moments) must be "
                        f"an integer >= 1 with sync_moments, or None, got {moment_syncs!r}"
                        f"{'' if sync_moments else ' without sync_moments'}")


class MomentSync:
    """The inner optimizer's moments of one fragment's parameters, averaged with its outer sync (module doc).

    `first` and `second`: fp32 shadow parameters whose gradients carry this replica's first-moment delta
    and second moment into the exchange, and the means out of it."""

    def __init__(self, optimizer: torch.optim.Optimizer, named_params: Sequence[tuple[str, torch.nn.Parameter]],
                 slices: Sequence[slice | None] | None = None, outer_state: str = "device") -> None:
        """`slices`: per parameter, the rows (first-dimension indices) this sync covers (a fragment cut inside the
        tensor, geotrain.sync.streaming) or None for all of it (default: None for each). `outer_state`: where the
        shadows, the first moment's anchor and an eager sync's sent moments live (geotrain.optim.outer_state; the
        moments themselves are the inner optimizer's, on its device)."""
        self.optimizer = optimizer
        self.outer_state = outer_state
        self.params = [p for _, p in named_params]
        self.names = [name for name, _ in named_params]
        self.slices = [None] * len(self.params) if slices is None else list(slices)
        if len(self.slices) != len(self.params):
            raise SyncError(f"MomentSync: {len(self.slices)} slices for {len(self.params)} parameters")
        local = [local_shard(p).shape for p in self.params]  # a DTensor's moments are its local shard's
        shapes = [shape if s is None else torch.Size([len(range(shape[0])[s]), *shape[1:]])
                  for shape, s in zip(local, self.slices, strict=True)]

        def shadows() -> list[torch.nn.Parameter]:
            return [grad_carrier(shape, state_device(p, outer_state)) for p, shape in zip(self.params, shapes,
                                                                                          strict=True)]

        self.first, self.second = shadows(), shadows()
        self.anchor = [torch.zeros(shape, dtype=torch.float32, device=state_device(p, outer_state))
                       for p, shape in zip(self.params, shapes, strict=True)]
        self._sent: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def named_first(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(f"{name}.exp_avg", s) for name, s in zip(self.names, self.first, strict=True)]

    def named_second(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(f"{name}.exp_avg_sq", s) for name, s in zip(self.names, self.second, strict=True)]

    def _state(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Parameter i's moments (its slice's values, a view, when it has one)."""
        state = self.optimizer.state.get(self.params[i], {})
        if "exp_avg" not in state or "exp_avg_sq" not in state:
            raise SyncError(f"sync_moments: parameter {self.names[i]!r} has no AdamW moments at this outer sync (the "
                            f"inner optimizer has not stepped it: no gradient reached it yet); every synced parameter "
                            f"needs one, so freeze parameters that train on no data (requires_grad=False)")
        m, v = local_shard(state["exp_avg"]), local_shard(state["exp_avg_sq"])  # views: writes reach the state
        part = self.slices[i]
        return (m, v) if part is None else (m[part], v[part])

    def load(self, keep_sent: bool) -> None:
        """Write this replica's first-moment deltas and second moments into the shadows' gradients;
        `keep_sent`: remember them for an eager landing."""
        sent = []
        for i, (first, second, anchor) in enumerate(zip(self.first, self.second, self.anchor, strict=True)):
            m, v = (on_state(t, self.outer_state) for t in self._state(i))
            first.grad = m.float() - anchor
            second.grad = v.float().clone()
            if keep_sent:
                sent.append((m.float().clone(), second.grad.clone()))
        self._sent = sent if keep_sent else None

    def land(self, mix: float = 0.0) -> None:
        """The means landed in the shadows' gradients: the anchor moves to the first moment's mean, and the
        moments become mix x local + (1 - mix) x mean (blocking: mix 0, the means)."""
        for i, (m_mean, v_mean) in enumerate(self._means()):
            m, v = self._state(i)
            with torch.no_grad():
                m.copy_(torch.lerp(m_mean, on_state(m, self.outer_state).float(), mix).to(m.dtype))
                v.copy_(torch.lerp(v_mean, on_state(v, self.outer_state).float(), mix).clamp_min(0).to(v.dtype))

    def land_eager(self) -> None:
        """Eager landing: each moment moves by (mean - what this replica sent at the start)."""
        if self._sent is None:
            raise SyncError("MomentSync.land_eager without a load(keep_sent=True)")
        for i, ((m_mean, v_mean), (m_sent, v_sent)) in enumerate(zip(self._means(), self._sent, strict=True)):
            m, v = self._state(i)
            with torch.no_grad():
                m.add_((m_mean - m_sent).to(m.device, m.dtype))
                v.add_((v_mean - v_sent).to(v.device, v.dtype)).clamp_(min=0)
        self._sent = None

    def _means(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        means = []
        for anchor, first, second in zip(self.anchor, self.first, self.second, strict=True):
            if first.grad is None or second.grad is None:
                raise SyncError("MomentSync: landing before the exchange wrote the means")
            anchor.add_(first.grad.to(anchor.device))  # the landings read it, they do not write it
            means.append((anchor, second.grad.to(anchor.device).float().clamp_min(0)))
        return means

    def state_dict(self) -> dict[str, Any]:
        """The first moment's anchor, and the moments sent by an eager sync still in flight."""
        sent = {} if self._sent is None else {"sent": [[m.clone(), v.clone()] for m, v in self._sent]}
        return {"first_moment_anchor": [a.clone() for a in self.anchor], **sent}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("first_moment_anchor")
        if saved is None or len(saved) != len(self.anchor) or any(
                s.shape != a.shape for s, a in zip(saved, self.anchor, strict=True)):
            raise ValueError("checkpoint's moment-sync anchor does not match this fragment's parameters")
        for anchor, value in zip(self.anchor, saved, strict=True):
            anchor.copy_(value)
        self._sent = None if "sent" not in state else [(m, v) for m, v in state["sent"]]
