"""Distributed PowerSGD (Vogels et al., NeurIPS 2019): one shared rank-r basis per gradient matrix.

Per step, for every matrix-shaped gradient (ndim >= 2, viewed as M = grad.reshape(n, m)) that is
worth compressing, each worker w of the group does:

    M_w += residual_w                          error feedback (what earlier steps did not deliver)
    P_w  = M_w Q                               Q (m x r): last step's shared Q (warm start), orthonormalised;
                                               the first time a seeded N(0, 1) draw, the same on every worker
    P    = mean_w P_w          <- all-reduce 1 (with every uncompressed gradient in the same buffer)
    P^   = orthonormal columns of P            (reduced QR: rank-deficient P gives no NaN)
    Q_w  = M_w^T P^
    Q    = mean_w Q_w          <- all-reduce 2
    M'   = P^ Q^T                              the averaged gradient's rank-r approximation, every worker
    residual_w = M_w - P^ Q_w^T                kept locally: the part of M_w outside the shared basis

So M' = P^ P^^T mean_w M_w: exactly the mean gradient whenever that mean has rank <= r. The residual
uses the worker's own Q_w (already computed): the mean of the residuals is mean_w M_w - M', as with
torch's M_w - M', so the next steps' averages are the same in exact arithmetic, but a residual stays
bounded by |M_w| instead of accumulating the worker's deviation from the mean, step after step. Vectors and
scalars (biases, norms) and matrices with (n + m) r x `min_compression_rate` >= n m are averaged
uncompressed in fp32, in the first all-reduce. Before step `start_powersgd_iter` every gradient goes
uncompressed in one all-reduce. Two collectives per step for the whole model, whatever the number of
matrices: on high-latency links the number of collectives matters as much as their size.

`PowerSGDReducer` is the algorithm with the collective passed in (a `geotrain.comm.Collective`):
the DDP hook gives it a TorchCollective (one local worker), the runtime the same through its timed
transport, the in-process simulation a SimulatedCollective of all p workers (a sum in rank order).
With two workers both sum a + b, so the two agree bit for bit. Registered as `powersgd` in
`geotrain.comm.get_reducer` (the reducer protocol: see geotrain.comm).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from geotrain.codecs import CodecError, NonFiniteGradientError, parse_count, parse_flag
from geotrain.codecs.powersgd import low_rank, orthonormal_columns
from geotrain.comm.collectives import Collective
from geotrain.codecs.selection import seeded_generator

FP32_BYTES = 4


@dataclass(frozen=True)
class PowerSGDConfig:
    """Knobs of distributed PowerSGD, with torch's `PowerSGDState` names where they mean the same.

    rank: r, columns of P and Q (torch: matrix_approximation_rank). Bytes per compressed n x m matrix
        and step: 4 r (n + m), against 4 n m uncompressed.
    start_powersgd_iter: steps averaged uncompressed before compression starts. Default 0, the paper's
        algorithm: torch needs >= 2 because its residuals and Q's are keyed by bucket and DDP rebuilds
        its buckets after step 1; ours are keyed by parameter. Raise it (torch suggests ~10% of the run)
        if early compressed steps hurt.
    min_compression_rate: compress a matrix only if n m > min_compression_rate x r (n + m); smaller ones
        go uncompressed (P and Q would save little and cost two matrix products). 2.0 as torch.
    error_feedback: keep each worker's residual M_w - M' and add it to the next step's gradient.
    seed: seeds the first Q of each matrix (mixed with the parameter's index and shape).
    allow_nonfinite: False -> NaN/inf in any worker's gradient raises NonFiniteGradientError on every
        worker (checked after the first all-reduce, so all workers agree); True -> they propagate into
        the result (the compressed matrices become NaN) and residuals and Q's keep their old values.
    """

    rank: int = 4
    start_powersgd_iter: int = 0
    min_compression_rate: float = 2.0
    error_feedback: bool = True
    seed: int = 0
    allow_nonfinite: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise CodecError(f"powersgd: rank must be an integer >= 1, got {self.rank!r}")
        start = self.start_powersgd_iter
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise CodecError(f"powersgd: start_powersgd_iter must be an integer >= 0, got {start!r}")
        if not (isinstance(self.min_compression_rate, (int, float)) and math.isfinite(self.min_compression_rate)
                and self.min_compression_rate > 0):
            raise CodecError(f"powersgd: min_compression_rate must be a finite number > 0, "
                             f"got {self.min_compression_rate!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise CodecError(f"powersgd: seed must be an integer >= 0, got {self.seed!r}")
        for name in ("error_feedback", "allow_nonfinite"):  # strict: "no" is False, "maybe" is refused
            object.__setattr__(self, name, parse_flag(getattr(self, name), f"powersgd: {name}"))


def compressed_rank(shape: Sequence[int], config: PowerSGDConfig) -> int:
    """The rank used for a gradient of `shape`, or 0 when it is averaged uncompressed (`low_rank`)."""
    return low_rank(shape, config.rank, config.min_compression_rate)


@dataclass(frozen=True)
class PowerSGDLayout:
    """The parameters in a fixed order (model order: the same on every worker) and their ranks."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    ranks: tuple[int, ...]

    @classmethod
    def build(cls, named_shapes: Sequence[tuple[str, Sequence[int]]], config: PowerSGDConfig) -> PowerSGDLayout:
        names = tuple(name for name, _ in named_shapes)
        if len(set(names)) != len(names):
            raise CodecError(f"powersgd: parameter names must be unique, got {list(names)}")
        shapes = tuple(tuple(int(dim) for dim in shape) for _, shape in named_shapes)
        return cls(names, shapes, tuple(compressed_rank(shape, config) for shape in shapes))

    def rows(self, index: int) -> int:
        return self.shapes[index][0]

    def cols(self, index: int) -> int:
        return math.prod(self.shapes[index][1:])

    def numel(self, index: int) -> int:
        return math.prod(self.shapes[index])

    @property
    def compressed(self) -> tuple[int, ...]:
        """Indices of the parameters sent as P and Q."""
        return tuple(i for i, r in enumerate(self.ranks) if r)

    @property
    def uncompressed(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.ranks) if not r)

    def step_bytes(self, compressing: bool) -> tuple[int, ...]:
        """Bytes each worker hands to each all-reduce of one step (fp32): (uncompressed values + all P,
        all Q) while compressing, (every value,) before; empty collectives are skipped."""
        if not compressing:
            sizes = [sum(self.numel(i) for i in range(len(self.names)))]
        else:
            sizes = [sum(self.numel(i) for i in self.uncompressed)
                     + sum(self.rows(i) * self.ranks[i] for i in self.compressed),
                     sum(self.cols(i) * self.ranks[i] for i in self.compressed)]
        return tuple(FP32_BYTES * size for size in sizes if size)


class PowerSGDReducer:
    """Distributed PowerSGD for `local_workers` of the `world_size` workers of a group (see module doc).

    State (saved by `state_dict`): the step counter, the shared Q per compressed parameter, and each
    local worker's residual per compressed parameter. `declared_bytes`: what one worker hands to the
    collectives, from the layout (not measured), summed over steps.
    """

    def __init__(self, layout: PowerSGDLayout, config: PowerSGDConfig, world_size: int, local_workers: int = 1) -> None:
        if world_size < 1 or not 1 <= local_workers <= world_size:
            raise ValueError(f"need 1 <= local_workers <= world_size, got {local_workers} and {world_size}")
        self.layout = layout
        self.config = config
        self.world_size = world_size
        self.local_workers = local_workers
        self.iteration = 0
        self.qs: dict[str, torch.Tensor] = {}
        self.residuals: list[dict[str, torch.Tensor]] = [{} for _ in range(local_workers)]
        self.declared_bytes = 0

    name = "powersgd"
    whole_model = True
    """The DDP hook must hand it every parameter at once (one shared basis per step)."""

    def reduce(self, worker_grads: Sequence[Sequence[torch.Tensor]], collective: Collective,
               step: int | None = None) -> list[torch.Tensor]:
        """`worker_grads[w][i]`: local worker w's gradient of parameter i (layout order, any float dtype).
        Returns the group's averaged gradient per parameter (exact for the uncompressed ones, rank-r
        for the others), in the gradients' shapes and dtypes. Advances its own step counter (`step`
        is ignored: the counter is part of the saved state)."""
        self._check(worker_grads)
        all_reduce_sum = collective.all_reduce_sum
        compressing = self.iteration >= self.config.start_powersgd_iter and bool(self.layout.compressed)
        if compressing:
            means = self._compressed_round(worker_grads, all_reduce_sum)
        else:
            means = self._plain_round(worker_grads, all_reduce_sum)
        self.iteration += 1
        return [mean.reshape(grad.shape).to(grad.dtype) for mean, grad in zip(means, worker_grads[0], strict=True)]

    def _plain_round(self, worker_grads: Sequence[Sequence[torch.Tensor]],
                     all_reduce_sum: Any) -> list[torch.Tensor]:
        flats = [torch.cat([g.detach().reshape(-1).to(torch.float32) for g in grads]) for grads in worker_grads]
        mean = self._mean(flats, all_reduce_sum, self.layout.step_bytes(False))
        self._raise_if_nonfinite(mean)
        return list(mean.split([self.layout.numel(i) for i in range(len(self.layout.names))]))

    def _compressed_round(self, worker_grads: Sequence[Sequence[torch.Tensor]],
                          all_reduce_sum: Any) -> list[torch.Tensor]:
        layout, config = self.layout, self.config
        compressed, uncompressed = layout.compressed, layout.uncompressed
        declared = layout.step_bytes(True)
        matrices = [[self._corrected(w, i, grads[i]) for i in compressed] for w, grads in enumerate(worker_grads)]
        qs = [orthonormal_columns(self._start_q(i)) for i in compressed]
        first = [torch.cat([grads[i].detach().reshape(-1).to(torch.float32) for i in uncompressed]
                           + [(m @ q).reshape(-1) for m, q in zip(worker_matrices, qs, strict=True)])
                 for grads, worker_matrices in zip(worker_grads, matrices, strict=True)]
        total = self._mean(first, all_reduce_sum, declared[:1])
        u_numel = sum(layout.numel(i) for i in uncompressed)
        means: dict[int, torch.Tensor] = dict(zip(uncompressed, total[:u_numel].split(
            [layout.numel(i) for i in uncompressed]), strict=True))
        ps = [p.view(layout.rows(i), layout.ranks[i]) for i, p in zip(compressed, total[u_numel:].split(
            [layout.rows(i) * layout.ranks[i] for i in compressed]), strict=True)]
        if not bool(torch.isfinite(total).all()):
            self._raise_if_nonfinite(total)
            # allowed: propagate NaN into the compressed matrices, keep residuals and Q's as they were
            for i in compressed:
                means[i] = torch.full((layout.numel(i),), math.nan)
            return [means[i] for i in range(len(layout.names))]
        bases = [orthonormal_columns(p) for p in ps]
        local_qs = [[m.T @ p_hat for m, p_hat in zip(worker_matrices, bases, strict=True)]
                    for worker_matrices in matrices]
        second = [torch.cat([q.reshape(-1) for q in worker_qs]) for worker_qs in local_qs]
        q_total = self._mean(second, all_reduce_sum, declared[1:])
        q_means = [q.view(layout.cols(i), layout.ranks[i]) for i, q in zip(compressed, q_total.split(
            [layout.cols(i) * layout.ranks[i] for i in compressed]), strict=True)]
        for k, (i, p_hat, q) in enumerate(zip(compressed, bases, q_means, strict=True)):
            name = layout.names[i]
            approximation = p_hat @ q.T
            self.qs[name] = q.clone()
            if config.error_feedback:
                for w in range(len(worker_grads)):
                    self.residuals[w][name] = (matrices[w][k] - p_hat @ local_qs[w][k].T).reshape(-1)
            means[i] = approximation.reshape(-1)
        return [means[i] for i in range(len(layout.names))]

    def _corrected(self, worker: int, index: int, grad: torch.Tensor) -> torch.Tensor:
        """M_w: the gradient as an n x m fp32 matrix, plus the worker's residual (a new tensor)."""
        matrix = grad.detach().reshape(self.layout.rows(index), -1).to(torch.float32)
        residual = self.residuals[worker].get(self.layout.names[index]) if self.config.error_feedback else None
        return matrix + residual.view_as(matrix) if residual is not None else matrix.clone()

    def _start_q(self, index: int) -> torch.Tensor:
        """Last step's shared Q (warm start), or the seeded first draw: identical on every worker."""
        name = self.layout.names[index]
        if name in self.qs:
            return self.qs[name]
        m, r = self.layout.cols(index), self.layout.ranks[index]
        generator = seeded_generator(self.config.seed, index, self.layout.rows(index), m)
        return torch.randn(m, r, generator=generator)

    def _mean(self, flats: list[torch.Tensor], all_reduce_sum: Any, declared: tuple[int, ...]) -> torch.Tensor:
        if flats[0].numel() == 0:
            return flats[0]
        self.declared_bytes += sum(declared)
        return all_reduce_sum(flats).div_(self.world_size)

    def _raise_if_nonfinite(self, reduced: torch.Tensor) -> None:
        if self.config.allow_nonfinite or bool(torch.isfinite(reduced).all()):
            return
        raise NonFiniteGradientError(f"powersgd: a worker's gradient holds NaN/inf at step {self.iteration} "
                                     f"(every worker raises); pass allow_nonfinite=True to send them through")

    def _check(self, worker_grads: Sequence[Sequence[torch.Tensor]]) -> None:
        if len(worker_grads) != self.local_workers:
            raise ValueError(f"expected gradients of {self.local_workers} local worker(s), got {len(worker_grads)}")
        for grads in worker_grads:
            shapes = tuple(tuple(g.shape) for g in grads)
            if shapes != self.layout.shapes:
                raise ValueError(f"gradient shapes {shapes} do not match the layout {self.layout.shapes}")

    # -- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Config, step counter, shared Q's and the local workers' residuals (clones; CPU tensors)."""
        return {"config": asdict(self.config), "iteration": self.iteration,
                "qs": {name: q.clone() for name, q in self.qs.items()},
                "residuals": [{name: r.clone() for name, r in worker.items()} for worker in self.residuals]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore exactly; refuses a state of another rank setting, unknown parameters or wrong sizes."""
        saved_rank = state.get("config", {}).get("rank")
        if saved_rank != self.config.rank:
            raise CodecError(f"powersgd state was saved with rank {saved_rank}, this reducer uses {self.config.rank}")
        index = {name: i for i, name in enumerate(self.layout.names)}
        residuals = state.get("residuals", [])
        if len(residuals) != self.local_workers:
            raise CodecError(f"powersgd state holds {len(residuals)} workers' residuals, expected {self.local_workers}")
        for name, q in state.get("qs", {}).items():
            i = index.get(name)
            if i is None or tuple(q.shape) != (self.layout.cols(i), self.layout.ranks[i]):
                raise CodecError(f"powersgd state has a Q for {name!r} of shape {tuple(q.shape)} that this model "
                                 f"does not take")
        for worker in residuals:
            for name, r in worker.items():
                i = index.get(name)
                if i is None or not self.layout.ranks[i] or r.numel() != self.layout.numel(i):
                    raise CodecError(f"powersgd state has a residual for {name!r} ({r.numel()} values) that this "
                                     f"model does not take")
        self.iteration = parse_count(state.get("iteration", 0), "powersgd state: iteration")  # 1.7 refused
        self.qs = {name: q.detach().cpu().to(torch.float32).clone() for name, q in state.get("qs", {}).items()}
        self.residuals = [{name: r.detach().cpu().to(torch.float32).reshape(-1).clone() for name, r in worker.items()}
                          for worker in residuals]
