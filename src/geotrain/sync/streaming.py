"""Streaming DiLoCo (Douillard et al. 2025): the outer sync of OuterSync, one fragment of the model at a
time, its exchange overlapped with the next inner steps.

Fragments: the parameters, in their order (layer order), cut into P contiguous fragments of about
equal bytes. `split="layers"` (the default, `split_fragments`) cuts between tensors only, so a fragment
holds at least its largest tensor: bench wan's GPT sends 26.45% of itself at once with P = 4, a model
whose one weight is 88% of it sends 88%. `split="bytes"` (`split_fragments_by_bytes`) cuts the
parameters' rows (first dimension) at the row boundary nearest k x total / P bytes, splitting the tensor
each cut falls in: every fragment is 1/P of the model to within half a row at each of its cuts, and a
split tensor's pieces are views of its rows (`piece_view`; a matrix stays a matrix for per-tensor
codecs) that sync, land and carry their moments like whole tensors.

Fragment p has its own anchor and outer optimizer (an OuterStep) and its own exchange, and starts a
sync after 0-based step s when (s + 1 - p * H // P) % H == 0: every H steps, fragment p at offset
p * H // P, so at any sync the WAN carries about 1/P of the model.

Delay tau (0 <= tau < H): a sync started after step s encodes the fragment's outer gradient
(anchor - local) and posts its collective at once (async work of the process group when tau > 0:
the exchange travels while the inner steps go on; `DPExchange.start`) and lands after step s + tau:
it waits for the collective, decodes, and the fragment's anchor takes the outer step with the mean,
and the local fragment becomes  mix x local + (1 - mix) x new anchor  (the paper's mixing factor
alpha; mix 0 drops the local progress of the tau overlapped steps, the paper used 0.5 with overlap).
tau = 0, mix = 0 is blocking DiLoCo: with P = 1 it is OuterSync, bit for bit (tested).

Eager landing (`landing="eager"`, Kale et al. 2025, "Eager updates for overlapped communication and
computation in DiLoCo"; with tau > 0, instead of the mix rule): at the start the fragment takes the
outer step with this replica's own outer gradient as the proxy of the mean (scaled as the mean would be:
through the same outer optimizer, whose state is left untouched), local = anchor + proxy change; when
the mean lands the anchor takes the true step and the local fragment moves by only the correction,
true change - proxy change. So no inner step runs on discarded progress (mix 0) or on a half-mixed
one (mix 0.5): with outer averaging (lr 1, momentum 0) the proxy is the local fragment itself, and
after landing local = the replicas' mean at the start + this replica's progress of the tau steps.

Overlap warm-up (`warmup` W steps, default 0): a sync started before step W blocks (tau 0, no mixing),
so the first outer periods run as blocking DiLoCo. Early in training a replica's own weights are far
worse than the replicas' mean (bench wan's tiny GPT after 5 steps: 3.083 nats against the mean's 2.942;
after 30: 2.399 against 2.386), and the inner steps a late sync lets run from them (any landing rule)
slowed the whole run down: delayed rows reached bench wan's target 7-17 steps after the blocking one,
with the first two syncs blocking (W = 10) the eager one reaches it one step after it (docs/history/wan.md).

Moment sync (`sync_moments`, geotrain.sync.moments): each fragment's exchange also averages the inner
AdamW's moments of its parameters, in the same collective, and they land as the parameters do; with
`moment_syncs` N only the fragment's first N syncs carry them (`syncs_started` counts them from the step,
so a resumed run agrees), and later ones send the outer gradients alone.

At the run's last step (`total_steps`; or `flush()`, e.g. when a DiLoCo context closes) every sync in
flight lands and then every fragment syncs at once, blocking and without mixing, so all replicas end
on the same parameters. Every collective is posted from the training thread, so all ranks issue
them in one order and the loop may run its own collectives on the same group meanwhile; under
`geotrain emulate` the posted work's link time overlaps the compute until it is waited for.

Checkpoints: one that falls while syncs are in flight settles them (`settle`, geotrain.sync.settle): the posted
collectives are waited for at the checkpoint and what they delivered is kept in the state and applied at each
sync's own landing step, so a run resumed from it continues the uninterrupted run bit for bit (tested in
tests/integration/runtime/test_runtime_resume_outer_syncs.py); the price is one exposed wait per checkpoint.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from geotrain.optim.outer import DILOCO_LR, DILOCO_MOMENTUM, LANDINGS, OuterStep
from geotrain.optim.outer_state import check_outer_state, state_device
from geotrain.optim.shards import is_sharded, local_shard
from geotrain.sync.base import DPExchange, StepTimer, SyncError, free_grads, grad_carrier, set_grads
from geotrain.sync.moments import (PARTS_WITH_MOMENTS, MomentSync, MomentTensors, check_moment_optimizer,
                                   check_moment_syncs)
from geotrain.sync.outer import OuterSync
from geotrain.sync.settle import Delivered, redeliver, settle

FRAGMENT_SPLITS = ("layers", "bytes")
"""How the parameters are cut into fragments (module doc): between tensors only, or at equal bytes."""


def split_fragments(nbytes: Sequence[int], fragments: int) -> list[range]:
    """Contiguous index ranges of `nbytes` (one size per parameter, in order) into `fragments` non-empty
    pieces whose byte sums are as close to total / fragments as contiguous cuts allow (greedy: each cut
    at the first index where the running sum reaches k x total / fragments)."""
    n = len(nbytes)
    if isinstance(fragments, bool) or not isinstance(fragments, int) or not 1 <= fragments <= n:
        raise SyncError(f"fragments must be an integer in 1..{n} (the parameter tensors), got {fragments!r}")
    cumulative = list(itertools.accumulate(nbytes, initial=0))
    cuts = [0]
    for k in range(1, fragments):
        target = k * cumulative[-1] / fragments
        j = bisect.bisect_left(cumulative, target)  # first cut whose bytes before it reach the target
        if j > 0 and target - cumulative[j - 1] <= cumulative[j] - target:
            j -= 1
        cuts.append(min(max(j, cuts[-1] + 1), n - (fragments - k)))  # every fragment non-empty
    cuts.append(n)
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


@dataclass(frozen=True)
class Piece:
    """Rows start..stop (indices of the first dimension) of parameter `index`; `whole`: all of its rows."""

    index: int
    start: int
    stop: int
    whole: bool


def split_fragments_by_bytes(rows: Sequence[int], row_bytes: Sequence[int], fragments: int) -> list[list[Piece]]:
    """`fragments` contiguous, non-empty runs of the parameters' rows (`rows` rows of `row_bytes` bytes per
    parameter, in order), each cut at the row boundary nearest k x total bytes / fragments; as Pieces."""
    n_rows = sum(rows)
    if isinstance(fragments, bool) or not isinstance(fragments, int) or not 1 <= fragments <= n_rows:
        raise SyncError(f"fragments must be an integer in 1..{n_rows} (the parameters' rows), got {fragments!r}")
    row_start = list(itertools.accumulate(rows, initial=0))
    byte_start = list(itertools.accumulate((n * b for n, b in zip(rows, row_bytes, strict=True)), initial=0))
    cuts = [0]
    for k in range(1, fragments):
        target = k * byte_start[-1] / fragments
        i = min(bisect.bisect_right(byte_start, target) - 1, len(rows) - 1)
        into = round((target - byte_start[i]) / row_bytes[i])  # the nearest row boundary in tensor i
        cuts.append(min(max(row_start[i] + min(into, rows[i]), cuts[-1] + 1), n_rows - (fragments - k)))
    cuts.append(n_rows)
    pieces: list[list[Piece]] = []
    for a, b in zip(cuts, cuts[1:]):
        fragment = []
        for i in range(bisect.bisect_right(row_start, a) - 1, len(rows)):
            if row_start[i] >= b:
                break
            start, stop = max(a, row_start[i]) - row_start[i], min(b, row_start[i + 1]) - row_start[i]
            if stop > start:
                fragment.append(Piece(i, start, stop, (start, stop) == (0, rows[i])))
        pieces.append(fragment)
    return pieces


def tensor_rows(tensor: torch.Tensor) -> int:
    """How many pieces `split="bytes"` may cut a tensor into: its first dimension's length (a scalar: 1)."""
    return tensor.shape[0] if tensor.dim() else 1


def fragment_pieces(params: Sequence[torch.Tensor], fragments: int, split: str = "layers") -> list[list[Piece]]:
    """The pieces of each of `fragments` fragments of `params` cut by `split` (FRAGMENT_SPLITS, module doc)."""
    if split == "layers":
        ranges = split_fragments([p.numel() * p.element_size() for p in params], fragments)
        return [[Piece(i, 0, tensor_rows(params[i]), True) for i in r] for r in ranges]
    if split == "bytes":
        rows = [tensor_rows(p) for p in params]
        row_bytes = [p.numel() * p.element_size() // max(n, 1) for p, n in zip(params, rows, strict=True)]
        return split_fragments_by_bytes(rows, row_bytes, fragments)
    raise SyncError(f"fragment split must be one of {', '.join(FRAGMENT_SPLITS)}, got {split!r}")


def piece_view(param: torch.Tensor, piece: Piece) -> torch.Tensor:
    """The tensor a piece syncs: the parameter itself when whole, else a view of its rows (writes to it write
    the parameter)."""
    return param if piece.whole else param.detach()[piece.start:piece.stop]


def _piece_name(name: str, piece: Piece) -> str:
    return name if piece.whole else f"{name}[{piece.start}:{piece.stop}]"


def fragment_due(step: int, fragment: int, fragments: int, sync_every: int) -> bool:
    """True if fragment `fragment` of `fragments` starts a sync after 0-based `step` (module doc)."""
    return (step + 1 - fragment * sync_every // fragments) % sync_every == 0


def syncs_started(step: int, fragment: int, fragments: int, sync_every: int) -> int:
    """How many syncs fragment `fragment` of `fragments` started after the 0-based steps before `step`
    (the steps s < step with fragment_due(s, ...))."""
    first = (fragment * sync_every // fragments - 1) % sync_every  # the first due step
    return max(0, (step - first + sync_every - 1) // sync_every)


def check_landing_settings(sync_every: int, delay: Any, mix: Any, landing: Any, warmup: Any) -> None:
    """SyncError (one line) unless `delay` tau is an integer in 0..sync_every-1, `mix` a number in [0, 1],
    `landing` one of LANDINGS (eager with mix 0) and `warmup` an integer >= 0 (module doc)."""
    if landing not in LANDINGS:
        raise SyncError(f"landing must be one of {', '.join(LANDINGS)}, got {landing!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise SyncError(f"warmup (steps whose syncs block) must be an integer >= 0, got {warmup!r}")
    if landing == "eager" and mix != 0:
        raise SyncError(f"mix {mix!r} is the mix landing's alpha; eager landing keeps the local progress "
                        f"itself: leave mix 0")
    if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay < sync_every:
        raise SyncError(f"delay must be an integer in 0..{sync_every - 1} (below sync_every), got {delay!r}")
    if isinstance(mix, bool) or not isinstance(mix, int | float) or not 0.0 <= mix <= 1.0 or math.isnan(mix):
        raise SyncError(f"mix (Streaming DiLoCo's alpha) must be a number in [0, 1], got {mix!r}")


@dataclass
class Fragment:
    """One fragment: its pieces of the parameters, its anchor and outer optimizer (over the pieces' tensors,
    `piece_view`), and the exchange that averages `shadows`' gradients (fp32 stand-ins of its pieces: the inner
    loop keeps the real gradients while an exchange is in flight). `storage`: the data pointer of each split
    parameter when its views were taken."""

    pieces: list[Piece]
    outer: OuterStep
    shadows: list[torch.nn.Parameter]
    exchange: DPExchange
    moments: MomentSync | None = None
    storage: dict[int, int] = field(default_factory=dict)


@dataclass
class _InFlight:
    fragment: int
    lands_after: int
    land: Callable[[StepTimer], int]
    proxy: list[torch.Tensor] | None = None  # eager landing: the anchor change applied at the start
    moments: bool = False  # the inner optimizer's moments travel in this sync
    started: int = 0  # the step it started after
    delivered: Delivered | None = None  # settled at a checkpoint (sync/settle.py): what it delivered, kept


class ExchangeFactory(Protocol):
    """Builds the exchange of one fragment from (name, shadow parameter) pairs, those that travel through the
    outer codec with its error feedback; with moment sync (geotrain.sync.moments) a second argument, the
    moments' shadows, which travel beside them in the same collective as the exchange's further parts
    (geotrain.sync.moments.moment_parts): a sync without them sends the first part alone."""

    def __call__(self, named: list[tuple[str, torch.nn.Parameter]], moments: MomentTensors | None = None, /
                 ) -> DPExchange: ...


class StreamingOuterSync(OuterSync):
    """OuterSync with fragments, overlap and delay (module doc)."""

    def __init__(self, named_params: Sequence[tuple[str, torch.nn.Parameter]], optimizer: torch.optim.Optimizer,
                 make_exchange: ExchangeFactory, sync_every: int, fragments: int = 1, delay: int = 0,
                 mix: float = 0.0, outer_lr: float = DILOCO_LR, outer_momentum: float = DILOCO_MOMENTUM,
                 total_steps: int | None = None, inner_exchange: DPExchange | None = None,
                 landing: str = "mix", warmup: int = 0, sync_moments: bool = False,
                 moment_syncs: int | None = None, fragment_split: str = "layers", outer_state: str = "device") -> None:
        """`outer_state`: where every fragment's anchor, outer momentum, shadows and moment anchors live, "device"
        or "host" (geotrain.optim.outer_state)."""
        named_params = list(named_params)
        try:
            check_outer_state(outer_state, "StreamingOuterSync: outer_state")
        except ValueError as exc:
            raise SyncError(str(exc)) from None
        if sync_moments:
            check_moment_optimizer(optimizer, "StreamingOuterSync")
        check_moment_syncs(moment_syncs, sync_moments)
        check_landing_settings(sync_every, delay, mix, landing, warmup)
        if isinstance(fragments, int) and not isinstance(fragments, bool) and fragments > sync_every:
            raise SyncError(f"fragments must be at most sync_every ({sync_every}) so their offsets differ, "
                            f"got {fragments}")
        self.params = [p for _, p in named_params]
        if any(is_sharded(p) for p in self.params) and fragment_split == "bytes" and fragments > 1:
            raise SyncError("StreamingOuterSync: sharded parameters (DTensor) sync per local shard; not with "
                            "fragment_split bytes (cut by layers)")
        self.optimizer = optimizer
        self.total_steps = total_steps
        self.inner_exchange = inner_exchange
        self.sync_every, self.delay, self.mix, self.landing = sync_every, delay, float(mix), landing
        self.warmup = warmup
        self.moment_syncs = moment_syncs
        self.fragments: list[Fragment] = []
        for pieces in fragment_pieces(self.params, fragments, fragment_split):
            named = [(_piece_name(named_params[piece.index][0], piece), piece_view(self.params[piece.index], piece))
                     for piece in pieces]
            shadows = [grad_carrier(local_shard(t).shape, state_device(t, outer_state)) for _, t in named]
            outer = OuterStep([t for _, t in named], sync_every, outer_lr, outer_momentum, outer_state)
            moments = None
            if sync_moments:
                owners = [(name, self.params[piece.index]) for (name, _), piece in zip(named, pieces, strict=True)]
                moments = MomentSync(optimizer, owners, [None if piece.whole else slice(piece.start, piece.stop)
                                                         for piece in pieces], outer_state)
            outer_named = [(name, s) for (name, _), s in zip(named, shadows, strict=True)]
            exchange = (make_exchange(outer_named) if moments is None
                        else make_exchange(outer_named, (moments.named_first(), moments.named_second())))
            storage = {piece.index: self.params[piece.index].data_ptr() for piece in pieces if not piece.whole}
            self.fragments.append(Fragment(pieces, outer, shadows, exchange, moments, storage))
        self._in_flight: list[_InFlight] = []
        # fragment -> the step after which its last sync landed at once, leaving the parameters at the new
        # anchor (blocking, or tau 0 without mixing): a flush after that same step has nothing to send
        self._landed_at: dict[int, int] = {}

    def after_inner_step(self, step: int, timer: StepTimer) -> int:
        """The outer sync after inner step `step` of a loop that steps the inner optimizer itself
        (geotrain.diloco); returns the bytes handed to the exchanges' collectives."""
        return self._outer_sync(step, timer)

    def _outer_sync(self, step: int, timer: StepTimer) -> int:
        """Land the syncs due after `step`, start the fragments due; at the last step, flush."""
        if self.total_steps is not None and step + 1 == self.total_steps:
            return self.flush(step, timer)
        dp_bytes = self._land(lambda flight: flight.lands_after <= step, step, timer)
        for p, fragment in enumerate(self.fragments):
            if fragment_due(step, p, len(self.fragments), self.sync_every):
                dp_bytes += self._start(p, step, timer)
        return dp_bytes

    def flush(self, step: int, timer: StepTimer) -> int:
        """Land every sync in flight, then sync every fragment at once, blocking, without mixing; a fragment
        whose sync after this same `step` already landed is skipped (its outer gradient is zero, but the outer
        Nesterov momentum would still move it: a loop that ends on a period's last step ends synced)."""
        dp_bytes = self._land(lambda flight: True, step, timer)
        for p in range(len(self.fragments)):
            if self._landed_at.get(p) == step:
                continue
            dp_bytes += self._start(p, step, timer, blocking=True)
        self.close()
        return dp_bytes

    def close(self) -> None:
        """Forget the syncs in flight without landing them (after an error only: replicas then differ)."""
        self._in_flight.clear()

    def moments_travel(self, p: int, step: int) -> bool:
        """True if fragment p's sync started after `step` carries the moments (module doc)."""
        return self.fragments[p].moments is not None and (
            self.moment_syncs is None
            or syncs_started(step, p, len(self.fragments), self.sync_every) < self.moment_syncs)

    def _start(self, p: int, step: int, timer: StepTimer, blocking: bool = False) -> int:
        fragment = self.fragments[p]
        self._check_storage(fragment)
        self._sync_started(step, p)
        blocking = blocking or step < self.warmup
        moments = self.moments_travel(p, step)
        parts = {} if fragment.moments is None else {"parts": PARTS_WITH_MOMENTS if moments else 1}
        with timer:
            local = fragment.outer.outer_gradients()
            set_grads(fragment.shadows, local)
            if moments:
                fragment.moments.load(keep_sent=not blocking and self.delay > 0 and self.landing == "eager")
        if blocking or self.delay == 0:
            dp_bytes = fragment.exchange.exchange(step, timer, **parts)
            self._apply(fragment, timer, 0.0 if blocking else self.mix, moments)
            if blocking or self.mix == 0.0:
                self._landed_at[p] = step
            self._sync_landed(step, dp_bytes, p)
            return dp_bytes
        land = fragment.exchange.start(step, timer, **parts)  # type: ignore[attr-defined]
        proxy = None
        if self.landing == "eager":
            with timer:
                proxy = fragment.outer.start_eager(local)
        self._in_flight.append(_InFlight(p, step + self.delay, land, proxy, moments, step))
        return 0

    def _land(self, ready: Callable[[_InFlight], bool], step: int, timer: StepTimer) -> int:
        """Apply the syncs in flight that are `ready`, in start order, after `step`; returns their bytes."""
        dp_bytes = 0
        for flight in [f for f in self._in_flight if ready(f)]:
            nbytes = flight.land(timer)
            dp_bytes += nbytes
            fragment = self.fragments[flight.fragment]
            self._apply(fragment, timer, self.mix, flight.moments, flight.proxy)
            self._in_flight.remove(flight)
            self._sync_landed(step, nbytes, flight.fragment, flight.started)
        return dp_bytes

    def _check_storage(self, fragment: Fragment) -> None:
        """A split parameter's views must still be its memory (`.data` replaced, e.g. by a `.to(device)`
        after the sync was built, would leave them syncing a copy nobody trains)."""
        for index, pointer in fragment.storage.items():
            if self.params[index].data_ptr() != pointer:
                raise SyncError(f"parameter {index} (split across fragments) moved to new memory after the outer "
                                f"sync was built: build it (DiLoCo) after model.to(device), or cut by layers")

    @staticmethod
    def _apply(fragment: Fragment, timer: StepTimer, mix: float, moments: bool,
               proxy: list[torch.Tensor] | None = None) -> None:
        """Apply a fragment's landed mean (OuterStep.land: eagerly with `proxy`, else mixed by `mix`), and the
        moments that travelled with it."""
        with timer:
            fragment.outer.land([s.grad for s in fragment.shadows], proxy, mix)  # type: ignore[misc]
            if moments and proxy is None:
                fragment.moments.land(mix)  # type: ignore[union-attr]
            elif moments:
                fragment.moments.land_eager()  # type: ignore[union-attr]
            free_grads(fragment.shadows)
            if moments:
                free_grads([*fragment.moments.first, *fragment.moments.second])  # type: ignore[union-attr]

    @property
    def in_flight(self) -> int:
        """Syncs started and not yet landed."""
        return len(self._in_flight)

    def fingerprint(self) -> float:
        """The anchors' float64 sum (every replica's is the same once no sync is in flight)."""
        return sum(f.outer.anchor_sum() for f in self.fragments)

    def _groups(self, p: int, moments: bool) -> list[list[torch.nn.Parameter]]:
        """The shadow parameters whose gradients fragment p's exchange writes (its moments' when they travel)."""
        fragment = self.fragments[p]
        extra = [] if not moments or fragment.moments is None else [fragment.moments.first, fragment.moments.second]
        return [fragment.shadows, *extra]

    def settle(self, timer: StepTimer) -> None:
        """Wait for every sync in flight and keep what it delivered; each still lands when due (sync/settle.py)."""
        for flight in self._in_flight:
            if flight.delivered is None:
                groups = self._groups(flight.fragment, flight.moments)
                flight.delivered = settle(flight.land, timer, groups)
                flight.land = redeliver(flight.delivered, groups)

    def state_dict(self) -> dict[str, Any]:
        """Inner optimizer, per fragment its anchor, outer optimizer and exchange, the syncs in flight (settled:
        `settle` first) and the fragments' last landings."""
        if any(flight.delivered is None for flight in self._in_flight):
            raise SyncError(f"state_dict with {len(self._in_flight)} outer sync(s) in flight: settle() first")
        flights = [{"fragment": f.fragment, "lands_after": f.lands_after, "started": f.started, "moments": f.moments,
                    **({} if f.proxy is None else {"proxy": [t.clone() for t in f.proxy]}),
                    "delivered": f.delivered.state_dict()} for f in self._in_flight]  # type: ignore[union-attr]
        return {"optimizer": self.optimizer.state_dict(),
                "fragments": [{"outer": f.outer.state_dict(), "exchange": f.exchange.state_dict(),
                               **({} if f.moments is None else {"moments": f.moments.state_dict()})}
                              for f in self.fragments],
                "in_flight": flights, "landed_at": [[p, step] for p, step in sorted(self._landed_at.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "fragments" not in state or len(state["fragments"]) != len(self.fragments):
            raise ValueError(f"checkpoint holds no streaming outer sync of {len(self.fragments)} fragments")
        self.optimizer.load_state_dict(state["optimizer"])
        for fragment, saved in zip(self.fragments, state["fragments"], strict=True):
            fragment.outer.load_state_dict(saved["outer"])
            fragment.exchange.load_state_dict(saved["exchange"])
            if (fragment.moments is None) != ("moments" not in saved):
                raise ValueError("checkpoint and run disagree on sync_moments (on in one, off in the other)")
            if fragment.moments is not None:
                fragment.moments.load_state_dict(saved["moments"])
        self._in_flight = []
        for saved in state.get("in_flight", []):
            p, moments = int(saved["fragment"]), bool(saved["moments"])
            delivered = Delivered.of(saved["delivered"])
            land = redeliver(delivered, self._groups(p, moments))
            self._in_flight.append(_InFlight(p, int(saved["lands_after"]), land, saved.get("proxy"), moments,
                                             int(saved["started"]), delivered))
        self._landed_at = {int(p): int(step) for p, step in state.get("landed_at", [])}
