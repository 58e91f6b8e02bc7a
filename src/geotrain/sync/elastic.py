"""The DP exchange of an elastic run: the mean over the live replica groups of the current torchft
quorum (geotrain.runtime.elastic), through the Manager's reconfigurable process group (with pipeline
S > 1, one Manager per stage process: stage s's exchange goes between the groups' stage-s processes).

One flat float32 all-reduce (SUM) per exchange carries every gradient and, last, this group's weight:
1 for a contributing group, 0 for one that recovered its state from a peer in this very quorum with
--sync-every (its outer gradient would repeat the peer's). Each member divides by the summed weight, so
the mean is over the contributing groups, whatever their number. After the all-reduce the Manager's
`should_commit` says whether every member of the quorum got it; if not (a peer died mid-way), the
exchange starts a new quorum (without the lost peer) and tries again with the same local gradient,
at most `retries` times. A retry's quorum may hand this group a newer state (it fell behind a peer
that committed): the step is then superseded (`StepSuperseded`) and the worker goes on from the
recovered step.

Codecs (`codec`, e.g. int8-block): the same codec reducer as a non-elastic run's exchange
(geotrain.comm.codec_reducer, the flat stage gradient as one tensor, error feedback), run on the quorum's
process group through `QuorumCollective`: summable codecs all-reduce their wire buffers (the weight summed
after them in the wire's dtype), the others all-gather their packed payloads (each group's float32 weight
after its bytes) and every member decodes and sums them in quorum rank order, so every member gets
bit-identical means. The reducer averages over the quorum's n members; a group of weight 0 sends the
encoding of zeros (the codecs decode it to zeros), and the mean is rescaled by n / contributors. A try
that does not commit leaves the residuals as they were: the retry encodes the same gradient again.
The residuals are each group's own and are never handed on: `state_dict` holds none, so a peer's or a
checkpoint's state starts a group from zero residuals (a restarted group, every group of a resumed run).
That is sound: a residual is what its own group's codec has not yet delivered of its own gradients, at
most one encoding's error; dropping it loses that much once (as one exchange without error feedback
would), while copying a peer's would deliver the peer's undelivered part twice.

Hierarchical (--dp-hierarchical, `hierarchy`: a replica group's region): every part goes through a
`QuorumHierarchy` (geotrain.sync.elastic_hierarchical): full precision inside the quorum's regions, the codec
(fp32 when uncompressed) between them, point to point on the quorum's group, with the same weights, commit and
retries as above; its residuals follow the shards' owners as the quorum changes, and are never handed on either.

CUDA (--device cuda): the exchange takes the gradients' host copies (geotrain.sync.base.host_gradients) over
torchft's gloo group (geotrain.comm.groups.torchft_backend, the non-elastic run's rule for the replicate
dimension) and writes the means back on each parameter's device. Not yet run on a GPU (benchmarks/cuda/check.sh).

Side sums (`exchange(step, timer, side)`): a small float64 tensor all-reduced (SUM) over the same quorum
in the same try, before the gradients, and kept (`side_sum`) only if that try commits: a retry sums it again
over the new quorum. Adaptive local steps (geotrain.sync.elastic_adaptive) send each group's presence and
measured step seconds this way, so the next period's split is over exactly the quorum that committed.

Streaming (--fragments P, --sync-delay tau; `make_elastic_sync` builds a StreamingOuterSync whose fragment
exchanges are `exchange.over(fragment)`, each with its own residuals): the rule for a quorum that changes
while a sync would be in flight is that no sync is ever in flight across a quorum. A fragment's exchange
runs whole, and is committed (`should_commit`, retried on a new quorum as above), in the quorum started
before the step that posts it; what it delivered is kept (geotrain.sync.settle) and lands tau steps later,
with the mix or eager rule, exactly as a non-elastic run lands it: the same numbers, only the overlap of
the exchange with the tau inner steps is not there. So every member that committed holds the same
delivered mean; a member that failed the exchange retries it or is superseded (it heals from a peer);
a group that heals between a sync and its landing receives the peer's kept mean in the peer's state
(`settle` before `state_dict`) and lands it at the same step.

Moment sync (--sync-moments, geotrain.sync.moments; through the same StreamingOuterSync): the inner AdamW's moments
travel in the outer sync's try as two more parts (`over(params, extra)`), the first moment through the outer codec
with its error feedback, the second through log-block without it (both uncompressed with an uncompressed outer
codec: then one fp32 all-reduce carries every part); all parts are averaged over the same contributors and committed
together. A group that heals takes its peer's AdamW state and moment anchors with the rest of its state.

    exchange = ManagerExchange(params, manager, healed=lambda: state.healed)
    sync = make_elastic_sync(options, params, exchange)      # PerStepSync, OuterSync, StreamingOuterSync or
                                                             # ElasticAdaptiveSync (geotrain.sync.elastic_adaptive)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from geotrain.codecs import CodecSpec
from geotrain.comm.codec_reducer import CodecReducer
from geotrain.comm.ledger import CommLedger, tensor_bytes
from geotrain.comm.registry import reducer_traits
from geotrain.optim.outer import OuterStep
from geotrain.optim.shards import is_sharded
from geotrain.sync.base import CollectivePause, GradientSync, StepTimer, SyncError, host_gradients
from geotrain.sync.elastic_adaptive import ElasticAdaptiveSync
from geotrain.sync.elastic_onebit import ElasticOneBitSync
from geotrain.sync.elastic_hierarchical import QuorumHierarchy, QuorumWire
from geotrain.sync.exchange import ExtraTensors
from geotrain.sync.factory import BETAS, WEIGHT_DECAY, onebit_adam
from geotrain.sync.moments import moment_parts
from geotrain.sync.options import SyncOptions
from geotrain.sync.outer import OuterSync
from geotrain.sync.per_step import PerStepSync
from geotrain.sync.settle import redeliver, settle
from geotrain.sync.streaming import StreamingOuterSync, fragment_due

Part = tuple[list[torch.nn.Parameter], CodecReducer | QuorumHierarchy | None]
"""Parameters whose gradients one exchange averages, and their codec reducer (None: uncompressed; a QuorumHierarchy:
hierarchical)."""

T = TypeVar("T")

EXCHANGE_RETRIES = 5
"""New quorums an exchange tries after a failed one before it gives up (each waits for the lost peer's
heartbeat timeout at most): enough for several groups failing one after another."""


class StepSuperseded(Exception):  # noqa: N818 - a control-flow signal, not an error
    """A retry's quorum gave this group a peer's newer state: drop this step's work, go on from the state's step."""


class QuorumLost(RuntimeError):
    """The exchange failed `retries` quorums in a row (transient: the group's launcher may restart it)."""


class QuorumCollective:
    """The Collective (geotrain.comm.collectives) of one try of an exchange over the current torchft quorum:
    this group's rank among the quorum's `num_participants()` groups, over the Manager's process group
    `pg`. Every collective carries, after the payload, this group's `weight` (1, or 0 for a group that
    contributes nothing in this quorum); `contributors` is their sum once a collective has run. A collective
    that fails (a peer died, links cut) reports the error to the Manager, whose `should_commit` then says
    no, and returns what its buffers hold. `pause()` is entered around each collective; `seconds` adds up
    their wall time."""

    def __init__(self, manager: Any, pg: Any, weight: float, pause: CollectivePause) -> None:
        self.manager, self.pg, self.weight, self.pause = manager, pg, float(weight), pause
        self.world_size = int(manager.num_participants())
        self.local_ranks = (int(manager.participating_rank() or 0),)
        self.ledger = CommLedger()
        self.contributors = 0.0
        self.seconds = 0.0

    def run(self, post: Callable[[], Any]) -> None:
        """Wait for what `post()` posts (pause entered, wall time added); a failure goes to the Manager."""
        if self.manager.errored() is not None:
            return  # this try already failed: should_commit says no
        started = time.perf_counter()
        with self.pause():
            try:
                post().wait()
            except Exception as exc:  # noqa: BLE001 - any transport error: the quorum's try fails, not the process
                self.manager.report_error(exc)
        self.seconds += time.perf_counter() - started

    def all_reduce_sum(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """The sum over the quorum of one wire buffer per group (its own dtype), the weight summed beside it."""
        from torch.distributed.distributed_c10d import AllreduceOptions, ReduceOp

        (wire,) = tensors
        buffer = torch.cat([wire.reshape(-1), torch.tensor([self.weight], dtype=wire.dtype)])
        self.ledger.record("all_reduce", tensor_bytes(buffer), self.world_size)
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp.SUM
        self.run(lambda: self.pg.allreduce([buffer], opts))
        self.contributors = float(buffer[-1])
        return buffer[:-1].view_as(wire)

    def all_reduce_mean(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """The mean over the quorum's members of one float32 tensor per group, every member weighing 1 (1-bit Adam's
        warm-up, geotrain.sync.elastic_onebit: `contributors` is the member count). No weight travels: the buffer is
        the non-elastic all-reduce's, so gloo cuts it alike and sums every value in the same order."""
        from torch.distributed.distributed_c10d import AllreduceOptions, ReduceOp

        (tensor,) = tensors
        total = tensor.float().clone()
        self.ledger.record("all_reduce", tensor_bytes(total), self.world_size)
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp.SUM
        self.run(lambda: self.pg.allreduce([total], opts))
        self.contributors = float(self.world_size)
        return total.div_(self.world_size)

    def all_to_all(self, sends: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Chunk j of this group's send buffer to quorum rank j; the chunks received, in quorum rank order (no
        weight travels: a caller that needs the contributors sums them in another collective of the try)."""
        from torch.distributed.distributed_c10d import AllToAllOptions

        (send,) = sends
        send = send.contiguous()
        self.ledger.record("all_to_all", tensor_bytes(send), self.world_size)
        if self.world_size == 1:
            return [send.clone()]
        received = torch.zeros_like(send)
        self.run(lambda: self.pg.alltoall_base(received, send, [], [], AllToAllOptions()))
        return [received]

    def all_gather(self, tensors: Sequence[torch.Tensor], algorithm: str = "ring") -> torch.Tensor:
        """Every group's packed bytes in quorum rank order (the ring: `algorithm` is the ring's only), each
        group's float32 weight gathered after its bytes."""
        from torch.distributed.distributed_c10d import AllgatherOptions

        (packed,) = tensors
        weight = torch.tensor([self.weight], dtype=torch.float32).view(torch.uint8)
        mine = torch.cat([packed.reshape(-1), weight])
        self.ledger.record("all_gather", tensor_bytes(mine), self.world_size)
        rows = [torch.zeros_like(mine) for _ in range(self.world_size)]
        self.run(lambda: self.pg.allgather([rows], [mine], AllgatherOptions()))
        gathered = torch.stack(rows)
        self.contributors = float(gathered[:, -weight.numel():].contiguous().view(torch.float32).sum())
        return gathered[:, :-weight.numel()].reshape(-1)


class ManagerExchange:
    """DPExchange over a torchft Manager's quorum (see the module doc). `manager`: a torchft Manager whose
    quorum for this step was started; `healed()`: True when this group loaded a peer's state in the
    quorum just started; `weight`: this group's weight in a quorum (its share of the global batch in
    replica-equivalents, n_g / batch_size: 1 with equal shares, runtime/batch_shares.py); `weight_on_heal`: its
    weight in a quorum it just healed into (0 with --sync-every);
    `start_quorum`: how a retry starts a new quorum (default: the manager's); `abort`: aborts the
    process group after a failed exchange (its next quorum configures a new one). `codec` (with
    `error_feedback`, and `pg`: the Manager's process group): a compressed exchange through the codec
    reducer of geotrain.comm (module doc "Codecs"); None or an uncompressed one: the fp32 all-reduce.
    `hierarchy` (a replica group -> its region; `group_world_size`: processes per group): the hierarchical exchange
    (module doc "Hierarchical"), the codec (None: fp32) between regions.
    `comm_s`: wall seconds spent in the collectives and commits so far (retries and their quorums included)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], manager: Any, healed: Callable[[], bool],
                 weight_on_heal: float = 1.0, retries: int = EXCHANGE_RETRIES, weight: float = 1.0,
                 start_quorum: Callable[[], None] | None = None, abort: Callable[[], None] | None = None,
                 codec: CodecSpec | str | None = None, error_feedback: bool = True, pg: Any = None,
                 hierarchy: Callable[[int], int] | None = None, group_world_size: int = 1) -> None:
        self.params = list(params)
        self.abort = abort
        self.manager = manager
        self.start_quorum = manager.start_quorum if start_quorum is None else start_quorum
        self.healed = healed
        self.weight_on_heal = weight_on_heal
        self.weight = weight
        self.retries = retries
        self.failed_quorums = 0
        self.contributors = 0.0
        self.side_sum: torch.Tensor | None = None
        self.comm_s = 0.0
        self.spec = None if codec is None else CodecSpec.parse(codec)
        if self.spec is not None and not self.spec.is_uncompressed and not reducer_traits(self.spec).hierarchical:
            raise SyncError(f"codec {str(self.spec)!r} is its own exchange; elastic groups take a codec of "
                            f"geotrain.codecs")  # (powersgd: rules.py refuses it)
        self.error_feedback = error_feedback
        self.pg = pg
        self.hierarchy, self.group_world_size = hierarchy, group_world_size
        self.inter_region_bytes = 0
        self.pause = CollectivePause()
        self.reducer = self.reducer_for(self.params)

    def reducer_for(self, params: Sequence[torch.Tensor], spec: CodecSpec | None = None,
                    error_feedback: bool | None = None) -> CodecReducer | QuorumHierarchy | None:
        """A codec reducer of `params` (residuals under their indices) through `spec` with `error_feedback` (None:
        this exchange's), None when that codec is uncompressed; hierarchical: a QuorumHierarchy (fp32 between
        regions when uncompressed)."""
        spec = self.spec if spec is None else spec
        if self.hierarchy is not None:
            return QuorumHierarchy(CodecSpec.uncompressed() if spec is None else spec,
                                   self.error_feedback if error_feedback is None else error_feedback,
                                   [p.shape for p in params], self.hierarchy, self.group_world_size)
        if spec is None or spec.is_uncompressed:
            return None
        return CodecReducer(spec.build(), [(str(i), p.shape) for i, p in enumerate(params)], 1,
                            error_feedback=self.error_feedback if error_feedback is None else error_feedback)

    def quorum_collective(self, weight: float) -> QuorumCollective:
        """The Collective of one try over the current quorum, this group weighing `weight`."""
        return QuorumCollective(self.manager, self.pg, weight, self.pause)

    def over(self, params: Sequence[torch.nn.Parameter], extra: Sequence[ExtraTensors] = ()) -> FragmentExchange:
        """The exchange of other parameters (a fragment's outer gradients) through this one's quorum; `extra`: more
        tensors that travel in the same try, each part through its own codec (moment sync's moments)."""
        return FragmentExchange(self, params, extra)

    def exchange(self, step: int, timer: StepTimer, side: torch.Tensor | None = None) -> int:
        """Average the gradients over the quorum's contributing groups, in place; bytes handed to the collectives.
        `side`: a small float64 tensor summed over the same quorum in the same try (module doc "Side sums")."""
        return self.average([(self.params, self.reducer)], step, timer, side)

    def average(self, parts: Sequence[Part], step: int, timer: StepTimer, side: torch.Tensor | None = None) -> int:
        """`exchange` of each part's parameters through its reducer (None: the fp32 all-reduce), every part in the
        same try and committed together; `side`'s sum over the committed quorum in `side_sum` (None without
        `side`)."""
        self.side_sum = None
        with timer:
            grads = [host_gradients(params) for params, _ in parts]  # on a GPU: host copies, gloo carries them
            weight = self.weight_on_heal if self.healed() else self.weight
        kept: list[list[dict[str, torch.Tensor]] | None] = []

        def attempt() -> tuple[torch.Tensor | None, list[list[torch.Tensor]], int]:
            kept[:] = [None if reducer is None else [dict(w) for w in reducer.residuals] for _, reducer in parts]
            summed = None if side is None else self._side_try(side)
            return (summed, *self._try(parts, grads, weight, step, timer))

        def rollback() -> None:
            for (_, reducer), residuals in zip(parts, kept, strict=True):
                if reducer is not None:
                    reducer.residuals = residuals  # the next try encodes the same gradient with the same residuals

        self.side_sum, means, nbytes = self.committed(step, attempt, rollback)
        if self.contributors <= 0:
            raise QuorumLost(f"elastic exchange at step {step}: no contributing replica group in the quorum")
        for (params, _), part_means in zip(parts, means, strict=True):
            for p, mean in zip(params, part_means, strict=True):
                p.grad = mean.to(p.device)
        return nbytes

    def committed(self, step: int, attempt: Callable[[], T], rollback: Callable[[], None] | None = None) -> T:
        """`attempt()` (one try of step `step`'s collectives over the current quorum) until the Manager commits it,
        each failed try followed by `rollback()` and a new quorum, at most `retries` more (module doc); its
        result. StepSuperseded when a retry's quorum handed this group a newer state, QuorumLost after the last
        failed try. `comm_s` adds the wall time."""
        started = time.perf_counter()
        for tried in range(self.retries + 1):
            if tried:
                self.start_quorum()
                if self.healed():
                    raise StepSuperseded(f"step {step}: recovered a newer state from a peer")
            result = attempt()
            if self.manager.should_commit():
                break
            if rollback is not None:
                rollback()
            self._failed()
        else:
            raise QuorumLost(f"elastic exchange at step {step}: {self.retries + 1} quorums in a row failed to commit")
        self.comm_s += time.perf_counter() - started
        return result

    def _side_try(self, side: torch.Tensor) -> torch.Tensor:
        """`side` summed over this try's quorum (float64; meaningful only if the try commits)."""
        from torch.distributed import ReduceOp

        summed = side.detach().to(torch.float64).clone()
        self.manager.allreduce(summed, reduce_op=ReduceOp.SUM).wait()
        return summed

    def _failed(self) -> None:
        self.failed_quorums += 1
        if self.abort is not None:
            self.abort()  # close our links now: members blocked on us in the ring fail at once, not at their timeout

    def _try(self, parts: Sequence[Part], grads: list[list[torch.Tensor]], weight: float, step: int,
             timer: StepTimer) -> tuple[list[list[torch.Tensor]], int]:
        """One try over the quorum: (per part, the means over its contributors; bytes handed); `contributors` set.
        Every part uncompressed: one fp32 all-reduce of them all; else each part through its reducer, in order."""
        if all(reducer is None for _, reducer in parts):
            flat, nbytes = self._try_plain([g for part in grads for g in part], weight, timer)
            means, offset = [], 0
            for part in grads:
                means.append(flat[offset:offset + len(part)])
                offset += len(part)
            return means, nbytes
        if any(reducer is None for _, reducer in parts):
            raise SyncError("an elastic exchange sends its parts all compressed or all uncompressed")
        if isinstance(parts[0][1], QuorumHierarchy):
            return self._try_hierarchical(parts, grads, weight, step, timer)
        collective = self.quorum_collective(weight)
        means = []
        with self.pause.timing(timer):
            for (_, reducer), part in zip(parts, grads, strict=True):
                reducer.world_size = collective.world_size
                sent = [g.detach() * weight if weight != 1.0 else g.detach() for g in part]
                mean = reducer.reduce([sent], collective, step)
                self.contributors = collective.contributors
                if 0 < self.contributors != collective.world_size:  # the reducer averaged over every member
                    mean = [m * (collective.world_size / self.contributors) for m in mean]
                means.append([m.to(g.dtype) for m, g in zip(mean, part, strict=True)])
        return means, collective.ledger.handed_bytes

    def _try_hierarchical(self, parts: Sequence[Part], grads: list[list[torch.Tensor]], weight: float, step: int,
                          timer: StepTimer) -> tuple[list[list[torch.Tensor]], int]:
        """One try of every part through its QuorumHierarchy (module doc "Hierarchical"); `inter_region_bytes`
        adds what this group sent to other regions."""
        collective = self.quorum_collective(weight)
        means, nbytes = [], 0
        with self.pause.timing(timer):
            for (_, hierarchy), part in zip(parts, grads, strict=True):
                assert isinstance(hierarchy, QuorumHierarchy)
                regions = hierarchy.regions(self.pg)
                wire = QuorumWire(self.pg, regions, collective.local_ranks[0], weight, self.manager.report_error,
                                  self.pause)
                flat = torch.cat([g.detach().reshape(-1).float() * weight for g in part])
                mean = hierarchy.reduce(flat, wire, step)
                self.contributors = wire.contributors
                if 0 < self.contributors != regions.world_size:  # the reducer averaged over every member
                    mean = mean * (regions.world_size / self.contributors)
                intra, inter = hierarchy.last_bytes
                nbytes += intra + inter
                self.inter_region_bytes += inter
                chunks, offset = [], 0
                for g in part:
                    chunks.append(mean[offset:offset + g.numel()].view_as(g).to(g.dtype))
                    offset += g.numel()
                means.append(chunks)
        return means, nbytes

    def _try_plain(self, grads: list[torch.Tensor], weight: float,
                   timer: StepTimer) -> tuple[list[torch.Tensor], int]:
        """One flat float32 all-reduce (SUM) of every gradient x weight, the weight last (module doc)."""
        from torch.distributed import ReduceOp

        with timer:
            buffer = torch.cat([g.detach().reshape(-1).float() * weight for g in grads] +
                               [torch.tensor([weight], dtype=torch.float32)])
        self.manager.allreduce(buffer, reduce_op=ReduceOp.SUM).wait()
        self.contributors = float(buffer[-1])
        means, offset = [], 0
        with timer:
            for g in grads:
                divisor = self.contributors if self.contributors > 0 else 1.0
                means.append((buffer[offset:offset + g.numel()] / divisor).view_as(g).to(g.dtype))
                offset += g.numel()
        return means, buffer.numel() * buffer.element_size()

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the error-feedback residuals are this group's own (module doc "Codecs"), never handed on."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state from elsewhere (a peer's, a checkpoint's): this group starts from zero residuals."""
        if self.reducer is not None:
            self.reducer.residuals = [{}]


class FragmentExchange:
    """The DPExchange of `params` (a Streaming DiLoCo fragment's outer gradients) through `hub`'s quorum, with
    residuals of its own. `start` runs the whole exchange, committed, when the sync is posted, and returns the
    landing of what it delivered (geotrain.sync.settle): nothing is in flight across a quorum (module doc
    "Streaming")."""

    def __init__(self, hub: ManagerExchange, params: Sequence[torch.nn.Parameter],
                 extra: Sequence[ExtraTensors] = ()) -> None:
        self.hub, self.params = hub, list(params)
        self.parts: list[Part] = [(self.params, hub.reducer_for(self.params))] + [
            ([p for _, p in part.named_params], hub.reducer_for([p for _, p in part.named_params], part.codec,
                                                                part.error_feedback)) for part in extra]

    def _travelling(self, parts: int | None) -> list[Part]:
        """The first `parts` parts (None: all): a moment sync after its first ones sends the outer gradients alone."""
        if parts is None:
            return self.parts
        if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= len(self.parts):
            raise SyncError(f"elastic exchange: parts must be an integer in 1..{len(self.parts)}, got {parts!r}")
        return self.parts[:parts]

    def exchange(self, step: int, timer: StepTimer, parts: int | None = None, side: torch.Tensor | None = None) -> int:
        """The hub's `average` of the travelling parts; `side`: summed over the same quorum (the hub's `side_sum`)."""
        return self.hub.average(self._travelling(parts), step, timer, side)

    def start(self, step: int, timer: StepTimer, parts: int | None = None) -> Callable[[StepTimer], int]:
        groups = [params for params, _ in self._travelling(parts)]
        delivered = settle(lambda now: self.exchange(step, now, parts), timer, groups)
        return redeliver(delivered, groups)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for _, reducer in self.parts:
            if reducer is not None:
                reducer.residuals = [{}]


def make_elastic_sync(options: SyncOptions, params: Sequence[torch.nn.Parameter], exchange: ManagerExchange,
                      sum_squares: Callable[[float], float] | None = None, group: int = 0,
                      replicas: int = 1, group_max: Callable[[float], float] | None = None) -> GradientSync:
    """ElasticOneBitSync (1-bit Adam, geotrain.sync.elastic_onebit), PerStepSync (no sync_every), blocking OuterSync
    (sync_every H), ElasticAdaptiveSync (adaptive local steps:
    replica group `group` of `replicas`) or StreamingOuterSync (fragments > 1, delay > 0 or sharded parameters: one
    `exchange.over(...)` per fragment) around `exchange`, with AdamW as geotrain.sync.make_gradient_sync builds
    it. Clipping: `sum_squares` turns this process's sum of squared (averaged) gradients into the whole model's
    (a pipeline stage: summed over the group's stages); None: local (the process holds the whole model).
    `group_max`: a float's max over the group's S x K processes (adaptive local steps: one split per group)."""
    params = list(params)
    if options.optimizer == "onebit-adam":  # per step, S = 1, equal weights (rules.py, the composition table)
        return ElasticOneBitSync(params, onebit_adam(options, params), exchange)
    adamw = torch.optim.AdamW(params, lr=options.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
    outer, streaming = options.outer, options.streaming
    if outer.sync_every is None:
        return PerStepSync(params, exchange, adamw, options.clip_grad_norm, sum_squares)
    if options.heterogeneity.local_steps == "adaptive":  # one fragment (rules.py refuses the rest)
        step = OuterStep(params, outer.sync_every, outer.outer_lr, outer.outer_momentum)
        codec = options.exchange
        return ElasticAdaptiveSync(params, adamw, step, exchange, group, replicas, outer.sync_every,
                                   -(-options.total_steps // outer.sync_every),
                                   options.heterogeneity.local_steps_prior_s, group_max, streaming.delay,
                                   streaming.landing, streaming.mix, streaming.warmup,
                                   (lambda moments: moment_parts(moments, codec.codec, codec.error_feedback))
                                   if outer.sync_moments else None, outer.moment_syncs)
    # sharded parameters (DTensor, FSDP2): the streaming sync keeps shard-sized shadows (geotrain.optim.shards)
    if streaming.fragments > 1 or streaming.delay > 0 or outer.sync_moments or any(is_sharded(p) for p in params):
        codec = options.exchange
        return StreamingOuterSync([(str(i), p) for i, p in enumerate(params)], adamw,
                                  lambda shadows, moments=None: exchange.over(
                                      [p for _, p in shadows],
                                      () if moments is None else moment_parts(moments, codec.codec,
                                                                              codec.error_feedback)),
                                  outer.sync_every, streaming.fragments, streaming.delay, streaming.mix,
                                  outer.outer_lr, outer.outer_momentum, options.total_steps, None, streaming.landing,
                                  streaming.warmup, outer.sync_moments, outer.moment_syncs, streaming.fragment_split)
    step = OuterStep(params, outer.sync_every, outer.outer_lr, outer.outer_momentum)
    return OuterSync(params, adamw, step, exchange, options.total_steps)


def exchanges_after(options: SyncOptions, step: int) -> bool:
    """Whether the sync of `options` exchanges (needs a quorum) after 0-based `step`: every step, the end of
    an outer period, or (fragments) a step after which some fragment starts a sync; and the last step."""
    every = options.outer.sync_every
    if every is None or step + 1 == options.total_steps:
        return True
    fragments = options.streaming.fragments
    return any(fragment_due(step, p, fragments, every) for p in range(fragments))
