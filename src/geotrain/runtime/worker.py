"""One worker: one (stage, replica) slot of the plan. The same entry point serves our launcher and torchrun.

The rendezvous is torch's env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), so under torchrun
nothing changes; the launcher sets the same variables and hosts the store itself, as torchrun's agent
does (TORCHELASTIC_USE_AGENT_STORE=True). Per iteration: draw this replica's batch from (data seed,
step, replica), run torch's pipeline schedule over the replica's pipeline group (runtime/pipeline.py),
sum tied gradients between the stages holding copies, exchange gradients in the stage's DP group,
clip and step the optimizer (the stage's geotrain.sync GradientSync, runtime/dp_step.py), record timings; evaluate and checkpoint when due. At the end rank 0 gathers every
rank's records. Ranks are numbered by runtime/layout.py (stage x R + replica; a sharded plan's K shards of a slot
side by side); pipeline groups, DP groups and a sharded slot's shard group by new_group, each with the backend
comm/groups.group_backend gives its dimension. A sharded slot's ranks hold FSDP2 shards of the stage and compute
on their 1/K of the replica's batch (runtime/sharded.py); the outer sync runs per shard.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import time
import traceback
from datetime import timedelta
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from geotrain.comm.groups import collective_timeout, group_backend, new_group
from geotrain.data import WorldTokens
from geotrain.emulate.install import COMPUTE_CLOCKS, Emulation
from geotrain.emulate.rank_clock import host_work
from geotrain.errors import GeotrainError
from geotrain.models import all_reduce_tied_gradients, lm_loss, lr_at, stage_ties, validation_starts
from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime import replan
from geotrain.models import MODEL_PRESETS
from geotrain.cost.batch_shares import rebalanced_samples
from geotrain.runtime.batch_shares import (REBALANCE_EVERY, gradient_factor, rebalance_due, replica_compute_s,
                                           share_offset, weight_gradients)
from geotrain.observe.observer import NullObserver, open_observer
from geotrain.optim.shards import is_sharded
from geotrain.runtime.config import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.dp_step import create_stage_hierarchies, stage_gradient_sync
from geotrain.runtime.hosts import rendezvous_failure
from geotrain.runtime.memory_use import rank_memory
from geotrain.runtime.pipeline import Pipeline, owner_of, pipeline_forward, virtual_stages_of
from geotrain.runtime.slowdown import SlowDown, site_slowdowns
from geotrain.runtime.sharded import fully_shard_stage, shard_rows
from geotrain.runtime.shard_state import local_state, sharded_state
from geotrain.runtime.stages import build_layer_model, stage_boundaries, stage_modules, stage_shapes
from geotrain.runtime.delta_wire import DeltaWire
from geotrain.codecs import CodecSpec
from geotrain.codecs.delta import DeltaSpec, delta_memory_refusal, is_delta
from geotrain.runtime.training_data import load_training_data
from geotrain.runtime.transport import Transport, use_emulated_links
from geotrain.runtime.watchdog import Watchdog, end_on_sigterm
from geotrain.sync.adaptive import AdaptiveOuterSync
from geotrain.sync.async_step import AsyncOuterGradientSync, pause_updates, progress_steps
from geotrain.sync.base import ComputeTimer

EXIT_WORKER_ERROR = 1


def resolve_device(device: str, local_rank: int) -> torch.device:
    """--device as a torch device: auto = cuda when available; cuda uses GPU local_rank mod the GPU count."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeConfigError("device cuda: torch sees no CUDA device here (use --device cpu or auto)")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def check_gpus_per_rank(ranks_on_host: int, gpus: int) -> None:
    """NCCL needs a GPU of its own for each rank of a host: refuse more ranks than GPUs in one line."""
    if ranks_on_host > gpus:
        raise RuntimeConfigError(f"device cuda: {ranks_on_host} ranks on this host but {gpus} GPU(s); NCCL needs "
                                 "one GPU per rank (use a plan with at most that many devices per host, or "
                                 "--device cpu)")


def _store_client(timeout_s: float) -> Any:
    """A client of the rendezvous store (torchrun's agent or our launcher), under a per-attempt prefix."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=timeout_s))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"geotrain/{attempt}/", store)


class Worker:
    """State of one rank during a run (built after the process group is up)."""

    def __init__(self, config: RuntimeConfig, rank: int, device: torch.device, emulation: Emulation | None,
                 world: WorldTokens | None = None) -> None:
        self.config = config
        self.rank = rank
        self.device = device
        self.emulation = emulation
        self.layout = config.layout
        self.slot = self.layout.slot(rank)
        S, R, V, K = config.stages, config.replicas, config.stages_per_rank, self.layout.k
        self.timeout_s = config.reliability.comm_timeout_s  # every group's collective timeout (comm/groups.py)
        shard = self.slot.shard
        # every rank creates every group, in one order (torch's new_group rule), and keeps its own
        self.groups = [[self._group(self.layout.dp_group_ranks(s, k), "replicate") for k in range(K)][shard]
                       for s in range(S)]
        pp_groups = [[self._group([self.layout.rank_of(s, r, k) for s in range(S)], "pipeline") for k in range(K)]
                     for r in range(R)]
        shard_groups = [[self._group(self.layout.shard_group_ranks(s, r), "shard") for r in range(R)]
                        for s in range(S)] if K > 1 else None
        self.shard_group = None if shard_groups is None else shard_groups[self.slot.stage][self.slot.replica]
        self.pp_ranks = [self.layout.rank_of(s, self.slot.replica, shard) for s in range(S)]
        self.data = load_training_data(config.data.data, config.data.data_seed, config.data.val_fraction, world,
                                       config.data.windows, config.data.epoch_windows)
        self.seq_len = config.sequence_length
        self.shares = config.batch_shares()  # sequences per replica (--batch-shares)
        self.share = self.shares[self.slot.replica]
        self.rows = shard_rows(self.share, K, shard)  # the part of the replica's batch this rank computes on
        model = build_layer_model(config.model.model_name, MODEL_PRESETS, config.run.seed, self.data.vocab_size,
                                  self.seq_len)
        if model.vocab_size is not None and self.data.vocab_size > model.vocab_size:
            raise RuntimeConfigError(f"model {config.model.model_name!r}: vocabulary of {model.vocab_size} is smaller "
                                     f"than the data's {self.data.vocab_size} ({self.data.source})")
        self.replanned: dict[str, Any] | None = None  # a resume on another layout: replan.layout_change
        self.resume_state = self._load_resume_state() if config.checkpoint.resume else None
        self.boundaries = self._boundaries(model)
        # found by parameter identity, which fully_shard breaks (it gives a slot's layers new DTensor parameters)
        ties = stage_ties(model.tied_weights, self.boundaries, model.n_layers)
        wire = config.comm.wire_dtypes()
        self.modules = stage_modules(model, self.boundaries, virtual_stages_of(self.slot.stage, S, V), wire,
                                     self.seq_len)
        # the shapes run the whole model on CPU: before this rank's stages move to the device
        self.shapes = stage_shapes(model, self.boundaries, (self.share // K) // config.schedule.microbatches,
                                  self.seq_len, wire)
        # a per-sample delta cut (runtime/delta_wire.py): a second pipeline of the wide carrier (first sights)
        self.delta_wire = wire if isinstance(wire, DeltaWire) else None
        self.wide_shapes = self.shapes
        if self.delta_wire is not None:
            refusal = delta_memory_refusal(self.delta_wire.delta, self.data.sample_count(self.seq_len),
                                           model.stage_io_shapes(self.boundaries, 1, self.seq_len)[0][1][1:])
            if refusal is not None:
                raise RuntimeConfigError(f"--pp-codec {self.delta_wire}: {refusal}")
            self.wide_shapes = stage_shapes(model, self.boundaries, (self.share // K) // config.schedule.microbatches,
                                            self.seq_len, wire, wide=True)
        for module in self.modules.values():
            module.to(device)
        if self.shard_group is not None:
            fully_shard_stage([self.modules[v] for v in sorted(self.modules)], self.shard_group, device)
        self.stage = torch.nn.ModuleList(self.modules[v] for v in sorted(self.modules))  # this rank's weights
        self.ties = self._tie_groups(ties)
        if self.ties and config.optim.outer_sync != "sync":
            raise RuntimeConfigError(f"--outer-sync {config.optim.outer_sync} with model {config.model.model_name!r}, "
                                     "whose weight is tied across pipeline stages: not built yet: each stage's global "
                                     "model has its own server, which would update the tied copies apart")
        scale = config.compute_scale()
        # compute counted by the emulated clock's own clock (wall or CPU seconds), so that it compares with
        # emulated time (compute fraction, predicted iteration); wall seconds without emulation
        clock = COMPUTE_CLOCKS[config.emulation.compute_clock] if emulation is not None else time.perf_counter
        self.timer = ComputeTimer(scale=1.0 if scale is None else scale[self.slot.device], clock=clock,
                                  device_sync=torch.cuda.synchronize if device.type == "cuda" else None)
        self.slowdown = SlowDown(site_slowdowns(config.reliability.chaos, self.slot.replica), self.timer, emulation)
        self.transport = Transport(self.layout, rank, config.emulation.time_scale)
        self.pp_group = pp_groups[self.slot.replica][shard]
        # adaptive local steps of a replica of several ranks (S stages x K shards): they agree on their step times in
        # a group of the replica's ranks (host tensors: the per-device backend, not a site's NCCL group); asynchronous
        # outer updates on their count and checkpoint rounds
        agree = config.optim.local_steps == "adaptive" or config.optim.outer_sync != "sync"
        replica_groups = ([self._group([self.layout.rank_of(s, r, k) for s in range(S) for k in range(K)], "replica")
                           for r in range(R)] if S * K > 1 and agree else None)
        replica_group = None if replica_groups is None else replica_groups[self.slot.replica]
        self.pipeline = Pipeline(config.schedule.schedule, self.modules, self.shapes, config.schedule.microbatches,
                                 lm_loss, self.pp_group, device, self.timer)
        self.wide_pipeline = self.pipeline if self.delta_wire is None else Pipeline(
            config.schedule.schedule, self.modules, self.wide_shapes, config.schedule.microbatches, lm_loss,
            self.pp_group, device, self.timer)
        # every rank creates every (stage, shard)'s region hierarchy, in one order (torch's new_group rule)
        hierarchy = (create_stage_hierarchies(self.layout, config.cluster.region_of,
                                              self.timeout_s)[self.slot.stage][shard]
                     if config.comm.dp_hierarchical else None)
        self.dp = stage_gradient_sync(config.sync_options(self.slot.stage), self.stage, self.transport,
                                      self.groups[self.slot.stage], hierarchy, rank, config.replicas,
                                      config.cluster, self.timeout_s, self.shard_group, replica_group)
        self.records: list[dict[str, Any]] = []
        self.start_step = 0

    def _group(self, ranks: list[int], dimension: str) -> Any:
        """A process group of `ranks` (every rank calls it, in one order) with the run's collective timeout and the
        backend of its `dimension` on this run's device (comm/groups.group_backend: NCCL inside a site on CUDA)."""
        sites = {self.config.cluster.site_of(self.layout.slot(r).device) for r in ranks}
        return new_group(ranks, self.timeout_s, group_backend(self.device.type, dimension, len(sites)))

    def _boundaries(self, model: Any) -> tuple[int, ...]:
        """The stage cut of the run: a resumed checkpoint's, else by the split rule (a measured "time"
        split is measured on rank 0 and broadcast, so every rank cuts alike)."""
        if self.resume_state is not None and "boundaries" in self.resume_state:
            return tuple(int(b) for b in self.resume_state["boundaries"])
        cfg = self.config
        options = {"weights": cfg.split_weights(), "plan_boundaries": cfg.schedule.split_boundaries}
        if cfg.schedule.split != "time":
            return stage_boundaries(model, cfg.pipeline_stages, cfg.schedule.split, self.seq_len, **options)
        found = [stage_boundaries(model, cfg.pipeline_stages, cfg.schedule.split, self.seq_len, **options)
                 if self.rank == 0 else None]
        dist.broadcast_object_list(found, src=0)
        return tuple(found[0])

    def _tie_groups(self, ties: Any) -> list[tuple[Any, Any, int | None]]:
        """(tie, group of this replica's ranks holding it, this rank's virtual stage holding it or None)
        for each tied weight held by more than one rank; every rank creates every group (torch's rule)."""
        S = self.config.stages
        result = []
        for tie in ties:
            holders = sorted({owner_of(v, S) for v in tie.stages})
            if len(holders) < 2:
                continue  # one rank holds every copy: it is one parameter there
            groups = [[self._group([self.layout.rank_of(s, r, k) for s in holders], "pipeline")
                       for k in range(self.layout.k)] for r in range(self.config.replicas)]
            mine = next((v for v in tie.stages if v in self.modules), None)
            result.append((tie, groups[self.slot.replica][self.slot.shard], mine))
        return result

    def _sum_tied_gradients(self) -> None:
        for tie, group, virtual_stage in self.ties:
            if virtual_stage is not None:
                all_reduce_tied_gradients(self.modules[virtual_stage].layers, virtual_stage, [tie], group)

    def _autocast(self) -> Any:
        if self.config.run.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _batch(self, step: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        cfg = self.config
        if not (self.pipeline.has_first or self.pipeline.has_last):
            return None, None
        x, y = self.data.share(cfg.data.data_seed, step, share_offset(self.shares, self.slot.replica), self.share,
                               sum(self.shares), self.seq_len)
        x, y = x[self.rows], y[self.rows]  # a sharded slot: this shard's part (all of it otherwise)
        # contiguous: the windows' views have the stride of a longer row, which torch's stage checks refuse
        return x.to(self.device).contiguous(), y.to(self.device).contiguous()

    def train_step(self, step: int, lr_step: int | None = None) -> dict[str, Any]:
        """One iteration at 0-based `step` (this rank's); `lr_step`: the step the learning rate is read at
        (None: `step`; adaptive local steps: the rank's place on the equal schedule)."""
        cfg = self.config
        started = time.perf_counter()
        self.timer.seconds = 0.0
        self.slowdown.before_step()
        mark = self.transport.step_mark(self.emulation)
        inputs, targets = self._batch(step)
        progress = step if lr_step is None else lr_step
        lr = lr_at(progress, cfg.run.steps, cfg.optim.lr)
        self.dp.set_lr(lr)
        self.dp.optimizer.zero_grad(set_to_none=True)
        pipeline, shapes = self._step_pipeline(step)
        pipeline_mark = self.transport.step_mark(self.emulation)
        with self._autocast():
            loss = pipeline.step(inputs, targets)
        pipeline_busy = self.transport.busy_since(self.emulation, pipeline_mark)
        self.slowdown.after_compute(self.timer.seconds)
        self._sum_tied_gradients()
        # weighted by samples: the DP mean of unequal shares is then the full batch's gradient
        weight_gradients(self.dp.params, gradient_factor(self.shares, self.slot.replica))
        before_sync = self.timer.seconds
        dp_bytes, grad_norm = self.dp.step(step, self.timer)
        sync_compute = self.timer.seconds - before_sync
        # A fingerprint of this stage's weights (a sharded slot: this rank's shard): replicas must stay bit-identical.
        param_sum = self.dp.fingerprint()
        loss = loss if loss is None or self.shard_group is None else self._slot_mean(loss)
        transfers = self.transport.p2p_since(self.emulation, mark)
        collectives = self.transport.take_records()
        return {"step": step, "rank": self.rank, "stage": self.slot.stage, "replica": self.slot.replica,
                **({"shard": self.slot.shard} if self.shard_group is not None else {}),
                "loss": loss, "samples": self.share, "lr": lr, "progress_step": progress,
                "compute_s": self.timer.seconds, "sync_compute_s": sync_compute, "pipeline_busy_s": pipeline_busy,
                "iteration_s": time.perf_counter() - started,
                "dp_s": sum(c.seconds for c in collectives), "dp_emulated_s": sum(c.emulated_s for c in collectives),
                "dp_bytes": dp_bytes, "grad_norm": grad_norm, "param_sum": param_sum, "pp_bytes": self._pp_bytes_sent(shapes), "val_loss": None,
                "boundaries": list(self.boundaries),
                "emulated": self.transport.step_span(self.emulation, mark, cfg.cluster.region_of),
                "transfers": [[t.kind, t.cut, t.seq, t.nbytes, t.handoff_t, t.end_t] for t in transfers],
                **({"cut_state": self.delta_wire.state_summary()}
                   if self.delta_wire is not None and step + 1 == cfg.run.steps else {})}

    def _step_pipeline(self, step: int) -> tuple[Pipeline, list[Any]]:
        """The pipeline (and its shapes) of `step`: the wide one when a delta cut sees a sample for the first time
        (both stages compute the step's windows, so both choose alike), else the run's."""
        if self.delta_wire is None:
            return self.pipeline, self.shapes
        cfg = self.config
        ids = self.data.share_ids(cfg.data.data_seed, step, share_offset(self.shares, self.slot.replica), self.share,
                                  sum(self.shares), self.seq_len)
        if self.delta_wire.begin_step(ids[self.rows]):
            return self.wide_pipeline, self.wide_shapes
        return self.pipeline, self.shapes

    def _slot_mean(self, value: float) -> float:
        """`value` averaged over a sharded slot's K ranks in float64 (each shard's loss on its 1/K of the replica's
        batch: their mean is the replica's loss)."""
        total = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(total, group=self.shard_group)
        return float(total.item()) / self.layout.k

    def rebalance_shares(self) -> None:
        """--batch-shares measured: new shares from the last REBALANCE_EVERY steps' compute of every replica
        (the same on every rank); the pipeline is rebuilt for this replica's new micro-batch size."""
        cfg = self.config
        mean_s = float(np.mean([r["compute_s"] for r in self.records[-REBALANCE_EVERY:]]))
        shares = rebalanced_samples(self.shares, replica_compute_s(mean_s, self.slot.replica, cfg.replicas),
                                    cfg.schedule.microbatches)
        if shares == self.shares:
            return
        self.shares, self.share = shares, shares[self.slot.replica]
        self.rows = shard_rows(self.share, self.layout.k, self.slot.shard)  # this rank's rows of the new share
        micro = (self.share // self.layout.k) // cfg.schedule.microbatches
        self.shapes = [dataclasses.replace(s, input_shape=(micro, *s.input_shape[1:]),
                                           output_shape=(micro, *s.output_shape[1:])) for s in self.shapes]
        self.pipeline = Pipeline(cfg.schedule.schedule, self.modules, self.shapes, cfg.schedule.microbatches, lm_loss,
                                 self.pp_group, self.device, self.timer)

    def _pp_bytes_sent(self, shapes: Sequence[Any]) -> int:
        """Activation bytes this rank sends to later stages per iteration (all micro-batches, all its
        virtual stages but the last of the pipeline) in the step's `shapes`; their gradients go back the same size."""
        last = self.config.pipeline_stages - 1
        per_micro = sum(int(np.prod(shapes[v].output_shape)) * shapes[v].output_dtype.itemsize
                        for v in self.modules if v != last)
        return per_micro * self.config.schedule.microbatches

    def evaluate(self) -> float | None:
        """Mean validation loss (nats) over at most eval_windows held-out windows, shared out by replica
        and run through the pipeline without gradients; known on the last stage's ranks, else None."""
        cfg = self.config
        if cfg.data.eval_local:
            return self._evaluate_local()
        windows = validation_starts(len(self.data.val), self.seq_len, cfg.data.eval_windows)
        starts = windows[self.slot.replica::cfg.replicas]
        totals = torch.zeros(2, dtype=torch.float64, device=self.device)
        self.stage.eval()
        try:
            for i in range(0, len(starts), cfg.schedule.batch_size):
                offsets = starts[i:i + cfg.schedule.batch_size, None] + np.arange(self.seq_len + 1)
                windows = torch.from_numpy(np.asarray(self.data.val)[offsets].astype(np.int64)).to(self.device)
                with self._autocast():
                    logits = pipeline_forward(self.modules, self.wide_shapes, self.slot.stage, self.pp_ranks,
                                              windows[:, :-1], len(windows))
                if logits is not None:
                    totals[0] += lm_loss(logits, windows[:, 1:]).double() * windows[:, 1:].numel()
                    totals[1] += windows[:, 1:].numel()
        finally:
            self.stage.train()
        if not self.pipeline.has_last:
            return None
        dist.all_reduce(totals, group=self.groups[self.slot.stage])
        return float(totals[0] / totals[1])

    def _evaluate_local(self) -> float:
        """data.eval_local: this replica's weights (one stage) on the evaluation windows, no collective outside its
        slot (a sharded slot's K ranks all score every window: FSDP2 gathers the weights inside the site); the
        emulated clock is set back afterwards, so no sync in flight travels during the evaluation."""
        from geotrain.models.evaluate import validation_loss

        clock = None if self.emulation is None else self.emulation.state().clock
        before = None if clock is None else clock.now()
        loss = validation_loss([self.modules[0]], np.asarray(self.data.val), self.seq_len,
                               max_windows=self.config.data.eval_windows)
        if clock is not None and before is not None:
            clock.restart(before)
        return loss

    def save(self, completed: int) -> dict[str, Any]:
        """Write this rank's shard of the checkpoint after `completed` steps (rank 0: then the manifest, once
        every rank has written); returns what the checkpoint event records: the shard's `path`, its `bytes`
        and the wall `seconds` of the whole save (the barrier included)."""
        cfg = self.config
        started = time.perf_counter()
        self.dp.settle(self.timer)  # the exchanges in flight, waited for and kept (sync/settle.py)
        # a sharded slot's DTensors (its weights, the inner optimizer's moments) as this rank's local shards
        state = ckpt.shard_state(self.slot_header(), cfg.assignment.tolist(), local_state(self.stage.state_dict()),
                                 self.boundaries, local_state(self.dp.state_dict()), completed, self.records)
        if self.delta_wire is not None:  # the per-sample state of a delta cut (runtime/delta_wire.py)
            state["cut"] = self.delta_wire.state_dict()
        path = ckpt.save_shard(cfg.checkpoint.checkpoint_dir, completed, self.rank, state, cfg.identity())
        dist.barrier()
        if self.rank == 0:
            ckpt.write_manifest(cfg.checkpoint.checkpoint_dir, completed, cfg.identity(), cfg.world_size)
            ckpt.prune_checkpoints(cfg.checkpoint.checkpoint_dir, cfg.checkpoint.keep_checkpoints,
                                   protect=(self.start_step,) if cfg.checkpoint.resume else ())
        return {"path": str(path), "bytes": path.stat().st_size, "seconds": time.perf_counter() - started}

    def _load_resume_state(self) -> dict[str, Any]:
        cfg = self.config
        step = ckpt.latest_step(cfg.checkpoint.checkpoint_dir)
        if step is None:
            raise ckpt.CheckpointError(f"{cfg.checkpoint.checkpoint_dir}: no complete checkpoint to resume from")
        manifest = ckpt.read_manifest(cfg.checkpoint.checkpoint_dir, step)
        replan.check_resume_identity(manifest, cfg.identity(), str(ckpt.step_dir(cfg.checkpoint.checkpoint_dir, step)))
        # a re-plan may change R
        source = replan.source_slot(manifest, self.slot.stage, self.slot.replica, self.slot.shard)
        state = ckpt.load_shard(cfg.checkpoint.checkpoint_dir, step, source["rank"], manifest, source)
        self.replanned = replan.layout_change(manifest, state, cfg.assignment.tolist())
        if replan.is_replan(manifest, state, cfg.assignment.tolist()):
            state["records"] = []  # they describe the old layout's slots: the report covers this one's steps
        state["_step"], state["_rank"] = step, source["rank"]
        return state

    def restore(self) -> None:
        cfg = self.config
        assert self.resume_state is not None
        state = self.resume_state
        step, shard = state["_step"], ckpt.shard_path(cfg.checkpoint.checkpoint_dir, state["_step"], state["_rank"])
        try:
            self.stage.load_state_dict(sharded_state(state["stage"], self._mesh()))
            self.dp.load_state_dict(sharded_state(state["dp"], self._mesh()))
            ckpt.restore_rng(state["rng"])
            if self.delta_wire is not None:  # the identity names the --pp-codec: a delta run's shard has its cut
                self.delta_wire.load_state_dict(state["cut"])
            self.records = list(state["records"])
            self.start_step = int(state["completed"])
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise ckpt.CheckpointError(f"{shard}: does not fit "
                                       f"this run's {self.layout.describe(self.rank)}: {first}") from None
        if self.start_step != step:
            raise ckpt.CheckpointError(f"{shard}: completed is "
                                       f"{self.start_step}, its directory says {step}")
        self.resume_state = None

    def _mesh(self) -> Any:
        """The device mesh of a sharded slot's parameters (FSDP2: the slot's K ranks); None when not sharded."""
        return next((p.device_mesh for p in self.stage.parameters() if is_sharded(p)), None)  # type: ignore[attr-defined]

    def slot_header(self) -> dict[str, int]:
        """What a shard says about whose it is; checked when it is loaded (a sharded slot's names its shard)."""
        shard = {"shard": self.slot.shard} if self.layout.k > 1 else {}
        return {"rank": self.rank, "stage": self.slot.stage, "replica": self.slot.replica, **shard}


def start_line(worker: Worker) -> None:
    """Every rank starts its first step together: a barrier once the ranks have built their models. Emulated,
    it also sets every rank's clock to the last one ready (set-up, run under host_work, counted at this machine's
    speed), and its end starts the loop: from there compute counts at the device's GPU speed (emulate/clock.py,
    the start-up rule). The barrier's own time is not a step's (its record is dropped)."""
    dist.barrier()
    worker.transport.take_records()


def warm_codecs(config: RuntimeConfig) -> None:
    """Load the compiled kernels of every codec the run uses now, before the rendezvous (and so before the watchdog
    starts): numba's loading holds the GIL (~0.5 s of CPU per process, seconds on a loaded host), and done later, in
    set-up, it kept this rank's heartbeat thread from beating past a short --heartbeat-timeout (bench chaos's 1.5 s:
    peers ended the run, "lost rank r ... its last completed step: none"). Set-up's own warm_up is then a no-op."""
    comm = config.comm
    specs = {str(spec): spec for spec in (*(comm.dp_codecs or (comm.dp_codec,)), *(comm.pp_codecs or (comm.pp_codec,)))}
    for text, spec in list(specs.items()):  # a delta cut's codecs, each by its spec
        if is_delta(spec):
            del specs[text]
            delta = DeltaSpec.of(spec)
            specs.update({str(delta.codec_spec(key)): delta.codec_spec(key) for key in ("codec", "first", "grad")})
    for spec in specs.values():
        spec.build().warm_up()


def _train(config: RuntimeConfig, rank: int, watchdog: Watchdog, worker_box: list[Worker], device: torch.device,
           emulation: Emulation | None, world: WorldTokens | None,
           observer: NullObserver) -> list[dict[str, Any]] | None:
    with host_work():  # set-up (its collectives included) is host work: not at the GPU's speed (start_line)
        worker = Worker(config, rank, device, emulation, world)
        worker_box.append(worker)
        worker.dp.listener = observer
        if config.checkpoint.resume:
            worker.restore()
            observer.event("resume", worker.start_step)
            if worker.replanned is not None:
                observer.event("replan", worker.start_step, **worker.replanned)
        if isinstance(worker.dp, AsyncOuterGradientSync):  # before any rank sends its first request
            worker.dp.outer.plan_checkpoints(_async_pauses(worker, worker.dp))
    watchdog.publish_step(worker.start_step)
    start_line(worker)
    run, data, checkpoint = config.run, config.data, config.checkpoint
    if isinstance(worker.dp, AdaptiveOuterSync):
        _train_periods(worker, worker.dp, watchdog, observer)
        return _gather_records(config, rank, worker)
    if isinstance(worker.dp, AsyncOuterGradientSync):  # ranks end at different steps: sync/async_step.py
        _train_async(worker, worker.dp, watchdog, observer)
        return _gather_records(config, rank, worker)
    end = run.steps if run.stop_after is None else min(run.steps, worker.start_step + run.stop_after)
    for step in range(worker.start_step, end):
        record = worker.train_step(step)
        if data.evaluates_after(step, run.steps):
            record["val_loss"] = worker.evaluate()
        worker.records.append(record)
        observer.step(record)
        if rebalance_due(config.schedule.batch_shares, step):
            worker.rebalance_shares()
        watchdog.publish_step(step + 1)
        if checkpoint.due(step + 1, end):
            observer.event("checkpoint", step + 1, **worker.save(step + 1))
    return _gather_records(config, rank, worker)


def _stop_step(worker: Worker) -> int:
    """The equal schedule's step this launch ends at (--stop-after counts from the resumed step)."""
    run = worker.config.run
    return run.steps if run.stop_after is None else min(run.steps, worker.start_step + run.stop_after)


def _checkpoint_points(worker: Worker) -> list[int]:
    """The equal schedule's steps before the run's end at which a rank of uneven steps (adaptive, asynchronous)
    writes a checkpoint, and this launch's stop."""
    return worker.config.checkpoint.points(worker.start_step, _stop_step(worker), worker.config.run.steps)


def _async_pauses(worker: Worker, sync: AsyncOuterGradientSync) -> list[tuple[int, int]]:
    """The checkpoint rounds of the global model's server (sync/async_server.py): (updates, step) for each of
    `_checkpoint_points`, opened once the global model holds the step's replica updates, ceil(c x R / H)."""
    every, replicas = sync.outer.sync_every, worker.config.replicas
    pauses = [(pause_updates(c, every, replicas), c) for c in _checkpoint_points(worker)]
    return [(updates, c) for updates, c in pauses if updates < sync.target_updates]


def _train_async(worker: Worker, sync: AsyncOuterGradientSync, watchdog: Watchdog, observer: NullObserver) -> None:
    """--outer-sync async: this rank steps until the global model holds the run's budget, then the final exchange.
    A checkpoint (and a --stop-after) is a checkpoint round of the global model's server (sync/async_server.py):
    every rank pauses at the start of a period, and writes the checkpoint when all are paused, named by the equal
    schedule's step the round was planned for; the end's checkpoint is named by the run's steps."""
    stop, checkpoint = _stop_step(worker), worker.config.checkpoint
    step = sync.outer.inner_steps  # this rank's steps so far (a resumed run's: the checkpoint's)
    while not sync.done:
        before = (sync.outer.pushes, sync.outer.outer_step, sync.outer.exchange_s)
        # the learning rate at the run's progress (the global model's), not this rank's own steps: a fast rank
        # takes more steps than the run's and would sit at the schedule's floor, a slow one at its peak
        lr_step = min(worker.config.run.steps - 1,
                      progress_steps(sync.outer.outer_step, sync.outer.sync_every, worker.config.replicas))
        record = worker.train_step(step, lr_step)
        _async_record(worker, sync, record, before)  # the global model this rank holds: its updates and its time
        paused = sync.paused_for()
        if sync.done and paused is None:
            _finish_async(worker, sync, record)
        worker.records.append(record)
        observer.step(record)
        step += 1
        watchdog.publish_step(step)
        if paused is not None:
            if checkpoint.checkpoint_dir is not None:
                observer.event("checkpoint", paused, **worker.save(paused))
            if paused >= stop:
                sync.outer.close()
                return
            if sync.done:
                _finish_async(worker, sync, record)
    if checkpoint.checkpoint_dir is not None:
        observer.event("checkpoint", worker.config.run.steps, **worker.save(worker.config.run.steps))


def _async_record(worker: Worker, sync: AsyncOuterGradientSync, record: dict[str, Any],
                  before: tuple[int, int, float]) -> None:
    """An asynchronous step's record (before its line is written): the global model this rank holds after it, the
    run's progress (`progress_step`: the equal schedule's step of the global model the step started from),
    `exchange_s` (its blocking exchange, the step's clock); its validation (the end: _finish_async)."""
    cfg = worker.config
    pushes, updates, exchanged = before
    record.update(global_updates=sync.outer.outer_step, global_time_s=sync.outer.model_time_s,
                  progress_step=min(cfg.run.steps - 1, progress_steps(updates, sync.outer.sync_every, cfg.replicas)),
                  exchange_s=sync.outer.exchange_s - exchanged)
    if not sync.done and sync.evaluates_now(pushes, cfg.data.eval_every if cfg.data.eval_local else 0):
        record["val_loss"] = worker.evaluate()


def _finish_async(worker: Worker, sync: AsyncOuterGradientSync, last: dict[str, Any]) -> None:
    """The asynchronous run's end (sync/async_step.py): the final exchange (every rank then holds the final global
    model; rank 0 serves the others' last replies), whose bytes, seconds and emulated end the last step's record
    takes, and its validation."""
    mark = worker.transport.step_mark(worker.emulation)
    exchanged = sync.outer.exchange_s
    last["dp_bytes"] += sync.finish()
    last["param_sum"] = sync.fingerprint()
    last.update(global_updates=sync.outer.outer_step, global_time_s=sync.outer.model_time_s,
                exchange_s=last["exchange_s"] + sync.outer.exchange_s - exchanged)
    span = worker.transport.step_span(worker.emulation, mark, worker.config.cluster.region_of)
    _extend_span(last, span)
    if worker.config.data.eval_every:
        last["val_loss"] = worker.evaluate()


def _extend_span(record: dict[str, Any], span: dict[str, Any] | None) -> None:
    """A step's record takes what ran after it (an end's exchange): its bytes, traffic and emulated end."""
    if span is None or record.get("emulated") is None:
        return
    emulated = record["emulated"]
    emulated.update(end_s=span["end_s"], busy_s=emulated.get("busy_s", 0.0) + span["busy_s"],
                    bytes=emulated["bytes"] + span["bytes"],
                    inter_region_bytes=emulated["inter_region_bytes"] + span["inter_region_bytes"],
                    inter_region_wire=list(emulated["inter_region_wire"]) + list(span["inter_region_wire"]))


def _train_periods(worker: Worker, sync: AdaptiveOuterSync, watchdog: Watchdog, observer: NullObserver) -> None:
    """optim.local_steps adaptive: this rank steps until the outer syncs reach the run's periods, ceil(steps / H)
    (ranks take different step counts between syncs; geotrain.sync.adaptive). The learning rate follows the
    rank's place on the equal schedule; evaluation runs after the syncs where the equal schedule's step count
    is due (every rank is there at once). Checkpoints and --stop-after count the equal schedule's steps: the one
    of step c is taken by each rank at its own share of the period c falls in (AdaptiveOuterSync.
    checkpoint_position), and the end's after the last sync, named by the run's steps.
    Records add `outer_step` (syncs started after the step), `syncs_landed` (of those, landed: fewer with a sync
    delay) and `local_steps` (H_r of the step's period)."""
    run, data, checkpoint = worker.config.run, worker.config.data, worker.config.checkpoint
    every, periods = sync.sync_every, sync.periods  # ceil(steps / H): the factory gives it (sync.factory)
    assert periods is not None
    stop, points = _stop_step(worker), _checkpoint_points(worker)
    step = sync.inner_steps  # this rank's steps so far (a resumed run's: the checkpoint's)
    while sync.outer_step < periods:
        if points and sync.checkpoint_position(points[0]) == sync.period_steps:
            completed = points.pop(0)
            if checkpoint.checkpoint_dir is not None:
                observer.event("checkpoint", completed, **worker.save(completed))
            if completed == stop:
                return
            continue
        before, local = sync.outer_step, sync.my_local_steps
        record = worker.train_step(step, min(sync.progress_step(), run.steps - 1))
        record.update(outer_step=sync.outer_step, local_steps=local, syncs_landed=sync.outer_step - sync.in_flight)
        if sync.outer_step >= periods:  # the last step: the end's landing before its validation and its line
            mark = worker.transport.step_mark(worker.emulation)
            nbytes = sync.flush(worker.timer)  # the sync and step times in flight (every rank ended its last period)
            record.update(param_sum=sync.fingerprint(), syncs_landed=sync.outer_step,
                          dp_bytes=record["dp_bytes"] + nbytes)
            _extend_span(record, worker.transport.step_span(worker.emulation, mark, worker.config.cluster.region_of))
        if sync.outer_step > before and data.evaluates_after(min(sync.outer_step * every, run.steps) - 1, run.steps):
            record["val_loss"] = worker.evaluate()
        worker.records.append(record)
        observer.step(record)
        step += 1
        watchdog.publish_step(step)
    if checkpoint.checkpoint_dir is not None:
        observer.event("checkpoint", run.steps, **worker.save(run.steps))


def _gather_records(config: RuntimeConfig, rank: int, worker: Worker) -> list[dict[str, Any]] | None:
    if worker.records:  # what this rank holds at the end, on its last record (runtime/memory_use.py)
        worker.records[-1]["memory"] = rank_memory(worker.stage, worker.dp, worker.device, config.optim.outer_state)
    gathered: list[Any] | None = [None] * config.world_size if rank == 0 else None
    dist.gather_object(worker.records, gathered, dst=0)
    return None if gathered is None else [record for records in gathered for record in records]


def _timed_out(exc: Exception, timeout_s: float, suspects: list[tuple[int, int]], layout: Any) -> str:
    """A gloo timeout in words: the --comm-timeout that ran out and the ranks that most likely held it up
    (Watchdog.suspects: a rank stuck but alive keeps its heartbeat, so only the timeout ends the wait)."""
    peers = "; ".join(f"{layout.describe(r)} after {done} completed steps" for r, done in suspects[:3])
    gloo = re.sub(r"^\[[^]]*\]\s*", "", str(exc).strip().splitlines()[0])[:160]  # less gloo's source file
    return (f"no reply within --comm-timeout {timeout_s:g} s" + (f"; held up by {peers}" if peers else "")
            + f" ({type(exc).__name__}: {gloo})")


def run_worker(config: RuntimeConfig, world: WorldTokens | None = None) -> list[dict[str, Any]] | None:
    """Run this process's rank (from the env:// variables) to the end. `world`: the synthetic world
    `config.data.data_seed` if the caller has it and no --data is given (else built here). Returns every rank's
    per-step records on rank 0, None elsewhere. A lost peer or store ends the process (exit 3) via the watchdog;
    a GeotrainError of its own posts an abort notice and is re-raised; any other error first gives the
    watchdog one heartbeat timeout to name a lost peer, then posts the error and exits with status 1."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world_size != config.world_size:
        shards = f" x {config.layout.k} shards" if config.layout.k > 1 else ""
        raise RuntimeConfigError(f"the plan has {config.stages} stages x {config.replicas} replicas{shards} = "
                                 f"{config.world_size} workers, but WORLD_SIZE is {world_size}")
    torch.set_num_threads(config.run.threads)
    device = resolve_device(config.run.device, int(os.environ.get("LOCAL_RANK", rank)))
    if device.type == "cuda":
        if config.emulation.time_scale > 0:
            raise RuntimeConfigError(f"device {config.run.device}: CUDA found, but link emulation runs on CPU (gloo) "
                                     f"only; pass --time-scale 0 (time_scale is {config.emulation.time_scale!r}) or "
                                     "--device cpu")
        check_gpus_per_rank(int(os.environ.get("LOCAL_WORLD_SIZE", 1)), torch.cuda.device_count())
        torch.cuda.set_device(device)
        emulation = None
    else:
        emulation = use_emulated_links(config.cluster, config.layout, config.emulation.time_scale,
                                       config.emulation.compute_clock,
                                       config.compute_scale())
    warm_codecs(config)
    try:
        # on CUDA, NCCL moves the GPU tensors (activations, gradients) and gloo the host ones (the codecs'
        # buffers, the clipping norm's scalar)
        dist.init_process_group(group_backend(device.type, "world", len(config.cluster.region_names)),
                                init_method="env://",
                                rank=rank,
                                world_size=world_size, timeout=collective_timeout(config.reliability.comm_timeout_s))
    except (dist.DistStoreError, dist.DistNetworkError) as exc:  # peers never came: one line, not a traceback
        raise rendezvous_failure(exc, rank, world_size, config.reliability.comm_timeout_s) from None
    layout = config.layout
    reliability = config.reliability
    observer = open_observer(config, rank, emulation)
    worker_box: list[Worker] = []
    # however this rank ends (the watchdog's os._exit, SIGTERM, an error), its lines and why are on disk first
    watchdog = Watchdog(_store_client(reliability.heartbeat_timeout_s), _store_client(reliability.heartbeat_timeout_s),
                        rank, world_size,
                        lambda r: layout.describe(r, config.cluster.device_names),
                        reliability.heartbeat_interval_s, reliability.heartbeat_timeout_s, last_words=observer.fail,
                        waiting=lambda: bool(worker_box and worker_box[0].transport.waiting_on))
    watchdog.start()
    end_on_sigterm(watchdog)
    try:
        records = _train(config, rank, watchdog, worker_box, device, emulation, world, observer)
        observer.close()
    except KeyboardInterrupt:  # SIGINT sent to the rank itself (the launcher's Ctrl-C stops ranks with SIGTERM)
        steps = watchdog.completed_steps
        observer.fail(f"interrupted (SIGINT) after {steps} completed steps", steps)
        raise
    except Exception as exc:
        waiting = worker_box[0].transport.waiting_on if worker_box else None
        where = f"at step {watchdog.completed_steps + 1}" + (f" while waiting for {waiting}" if waiting else "")
        timed_out = "Timed out" in str(exc)  # gloo's words for a collective or transfer past its timeout
        slot = layout.slot(rank)
        group = layout.dp_group_ranks(slot.stage, slot.shard) if waiting else range(world_size)
        why = _timed_out(exc, reliability.comm_timeout_s, watchdog.suspects(group), layout) if timed_out else (
            f"{type(exc).__name__}: {exc}")
        message = f"{layout.describe(rank)} failed {where}: {why}"
        observer.fail(message, watchdog.completed_steps)  # 0-based: the step it was in
        if isinstance(exc, GeotrainError):  # a user-level error (bad checkpoint...): every rank sees it
            watchdog.post_abort(message)
            raise
        # Most likely a peer died and gloo noticed first: give the watchdog the time it needs to name
        # the lost rank (it exits this process itself); only then blame ourselves. A timeout has had that time.
        deadline = time.monotonic() + (0.0 if timed_out else reliability.heartbeat_timeout_s
                                       + 4 * reliability.heartbeat_interval_s)
        while time.monotonic() < deadline:
            time.sleep(reliability.heartbeat_interval_s)
        watchdog.post_abort(message)
        if os.environ.get("GEOTRAIN_TRACEBACK"):
            traceback.print_exception(exc, file=sys.stderr)
        print(f"geotrain worker: {message}", file=sys.stderr, flush=True)
        os._exit(EXIT_WORKER_ERROR)
    dist.barrier()
    watchdog.stop()
    dist.destroy_process_group()
    return records
