"""One worker: one (stage, replica) slot of the plan. The same entry point serves our launcher and torchrun.

The rendezvous is torch's env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), so under torchrun
nothing changes; the launcher sets the same variables and hosts the store itself, as torchrun's agent
does (TORCHELASTIC_USE_AGENT_STORE=True). Per iteration: draw the global batch from (data seed,
step), run the pipeline schedule on this replica's slice, exchange gradients in the stage's DP group,
step AdamW, record timings; checkpoint when due. At the end rank 0 gathers every rank's records.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from geotrain.codecs import ErrorFeedback, get_codec
from geotrain.data import get_batch, world_tokens
from geotrain.ddp.powersgd import PowerSGDConfig
from geotrain.errors import GeotrainError
from geotrain.models import lr_at
from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime.config import RuntimeConfig, RuntimeConfigError, parse_codec_spec
from geotrain.runtime.exchange import GradientExchange, PowerSGDGradientExchange
from geotrain.runtime.hierarchical_exchange import HierarchicalGradientExchange, create_stage_hierarchies
from geotrain.runtime.pipeline import ActivationPeer, ComputeTimer, run_schedule, schedule_order
from geotrain.runtime.stages import build_stage
from geotrain.runtime.transport import Transport, use_emulated_links
from geotrain.runtime.watchdog import Watchdog

EXIT_WORKER_ERROR = 1


def batch_generator(data_seed: int, step: int) -> torch.Generator:
    """The generator of step `step`'s global batch: a function of (seed, step) only, so resuming needs no state."""
    seed = int(np.random.SeedSequence([data_seed, step]).generate_state(1, dtype=np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(seed)


def make_codec(spec: str) -> Any:
    name, params = parse_codec_spec(spec)
    return get_codec(name, **params)


def make_gradient_exchange(config: RuntimeConfig, stage: torch.nn.Module, transport: Transport, group: Any,
                           devices: list[int]) -> GradientExchange | PowerSGDGradientExchange:
    """The DP exchange of `--dp-codec`: distributed PowerSGD for `powersgd` (per parameter matrix;
    codec parameters are PowerSGDConfig fields), else the codec on the flat stage gradient."""
    name, params = parse_codec_spec(config.dp_codec)
    if name == "powersgd":
        settings = PowerSGDConfig(**{**params, "error_feedback": config.error_feedback})
        return PowerSGDGradientExchange(list(stage.named_parameters()), settings, transport, group, devices)
    codec = get_codec(name, **params)
    return GradientExchange(list(stage.parameters()), codec, ErrorFeedback(codec) if config.error_feedback else None,
                            transport, group, devices)


def _store_client(timeout_s: float) -> Any:
    """A client of the rendezvous store (torchrun's agent or our launcher), under a per-attempt prefix."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=timeout_s))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"geotrain/{attempt}/", store)


class Worker:
    """State of one rank during a run (built after the process group is up)."""

    def __init__(self, config: RuntimeConfig, rank: int, tokens: torch.Tensor | None = None) -> None:
        self.config = config
        self.rank = rank
        self.layout = config.layout
        self.slot = self.layout.slot(rank)
        self.groups = [dist.new_group(self.layout.dp_group_ranks(s)) for s in range(config.stages)]
        self.stage = build_stage(config.model, config.seed, self.slot.stage, config.stages)
        self.optimizer = torch.optim.AdamW(self.stage.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.1)
        self.timer = ComputeTimer()
        self.transport = Transport(self.layout, rank, config.time_scale)
        pp_codec = make_codec(config.pp_codec)
        prev_rank, next_rank = self.layout.prev_rank(rank), self.layout.next_rank(rank)
        self.prev = None if prev_rank is None else ActivationPeer(self.transport, pp_codec, prev_rank, self.slot.stage - 1, self.timer)
        self.next = None if next_rank is None else ActivationPeer(self.transport, pp_codec, next_rank, self.slot.stage, self.timer)
        if config.dp_hierarchical:  # every rank creates every stage's hierarchy (torch's new_group rule)
            hierarchy = create_stage_hierarchies(self.layout, config.cluster.region_of)[self.slot.stage]
            self.exchange = HierarchicalGradientExchange(list(self.stage.parameters()), make_codec(config.dp_codec),
                                                         config.error_feedback, self.transport, hierarchy, rank)
        else:
            self.exchange = make_gradient_exchange(config, self.stage, self.transport, self.groups[self.slot.stage],
                                                   self.layout.dp_group_devices(self.slot.stage))
        self.tokens = None
        if self.stage.is_first or self.stage.is_last:
            self.tokens = tokens if tokens is not None else world_tokens(config.data_seed).train
        self.order = schedule_order(config.schedule, self.slot.stage, config.stages, config.microbatches)
        self.records: list[dict[str, Any]] = []
        self.start_step = 0

    def _microbatches(self, step: int) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]:
        if self.tokens is None:
            return None, None
        cfg = self.config
        x, y = get_batch(self.tokens, cfg.batch_size * cfg.replicas, cfg.model.context, batch_generator(cfg.data_seed, step))
        rows = slice(self.slot.replica * cfg.batch_size, (self.slot.replica + 1) * cfg.batch_size)
        return list(x[rows].chunk(cfg.microbatches)), list(y[rows].chunk(cfg.microbatches))

    def train_step(self, step: int) -> dict[str, Any]:
        cfg = self.config
        started = time.perf_counter()
        self.timer.seconds = 0.0
        inputs, targets = self._microbatches(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr)
        self.optimizer.zero_grad(set_to_none=True)
        loss = run_schedule(self.order, self.stage, self.prev, self.next, inputs, targets,
                            self.stage.activation_shape(cfg.microbatch_size, cfg.model.context), self.timer)
        self.transport.flush()
        dp_bytes = self.exchange.exchange(step, self.timer)
        with self.timer:
            self.optimizer.step()
        # A fingerprint of this stage's weights: replicas of a stage must stay bit-identical.
        param_sum = float(sum(p.detach().double().sum() for p in self.stage.parameters()))
        transfers, collectives = self.transport.take_records()
        return {"step": step, "rank": self.rank, "stage": self.slot.stage, "replica": self.slot.replica,
                "loss": loss, "compute_s": self.timer.seconds, "iteration_s": time.perf_counter() - started,
                "dp_s": sum(c.seconds for c in collectives), "dp_emulated_s": sum(c.emulated_s for c in collectives),
                "dp_bytes": dp_bytes, "param_sum": param_sum,
                "transfers": [[t.kind, t.cut, t.micro, t.nbytes, t.handoff_t, t.end_t] for t in transfers]}

    def save(self, completed: int) -> None:
        cfg = self.config
        state = {"slot": self.slot_header(), "stage": self.stage.state_dict(),
                 "optimizer": self.optimizer.state_dict(), "exchange": self.exchange.state_dict(),
                 "rng": ckpt.capture_rng(), "completed": completed, "records": self.records}
        ckpt.save_shard(cfg.checkpoint_dir, completed, self.rank, state)
        dist.barrier()
        if self.rank == 0:
            ckpt.write_manifest(cfg.checkpoint_dir, completed, cfg.identity(), cfg.world_size)

    def restore(self) -> None:
        cfg = self.config
        step = ckpt.latest_step(cfg.checkpoint_dir)
        if step is None:
            raise ckpt.CheckpointError(f"{cfg.checkpoint_dir}: no complete checkpoint to resume from")
        manifest = ckpt.read_manifest(cfg.checkpoint_dir, step)
        ckpt.check_identity(manifest, cfg.identity(), str(ckpt.step_dir(cfg.checkpoint_dir, step)))
        state = ckpt.load_shard(cfg.checkpoint_dir, step, self.rank, manifest, self.slot_header())
        try:
            self.stage.load_state_dict(state["stage"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.exchange.load_state_dict(state["exchange"])
            ckpt.restore_rng(state["rng"])
            self.records = list(state["records"])
            self.start_step = int(state["completed"])
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise ckpt.CheckpointError(f"{ckpt.shard_path(cfg.checkpoint_dir, step, self.rank)}: does not fit "
                                       f"this run's {self.layout.describe(self.rank)}: {first}") from None
        if self.start_step != step:
            raise ckpt.CheckpointError(f"{ckpt.shard_path(cfg.checkpoint_dir, step, self.rank)}: completed is "
                                       f"{self.start_step}, its directory says {step}")

    def slot_header(self) -> dict[str, int]:
        """What a shard says about whose it is; checked when it is loaded."""
        return {"rank": self.rank, "stage": self.slot.stage, "replica": self.slot.replica}


def _train(config: RuntimeConfig, rank: int, watchdog: Watchdog, worker_box: list[Worker],
           tokens: torch.Tensor | None) -> list[dict[str, Any]] | None:
    worker = Worker(config, rank, tokens)
    worker_box.append(worker)
    if config.resume:
        worker.restore()
    watchdog.publish_step(worker.start_step)
    end = config.steps if config.stop_after is None else min(config.steps, worker.start_step + config.stop_after)
    for step in range(worker.start_step, end):
        worker.records.append(worker.train_step(step))
        watchdog.publish_step(step + 1)
        due = config.checkpoint_every and (step + 1) % config.checkpoint_every == 0
        if config.checkpoint_dir and (due or step + 1 == end):
            worker.save(step + 1)
    gathered: list[Any] | None = [None] * config.world_size if rank == 0 else None
    dist.gather_object(worker.records, gathered, dst=0)
    return None if gathered is None else [record for records in gathered for record in records]


def run_worker(config: RuntimeConfig, tokens: torch.Tensor | None = None) -> list[dict[str, Any]] | None:
    """Run this process's rank (from the env:// variables) to the end. `tokens`: the training token ids
    of world `config.data_seed` if the caller has them (else built here). Returns every rank's per-step
    records on rank 0, None elsewhere. A lost peer or store ends the process (exit 3) via the watchdog;
    a GeotrainError of its own posts an abort notice and is re-raised; any other error first gives the
    watchdog one heartbeat timeout to name a lost peer, then posts the error and exits with status 1."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world_size != config.world_size:
        raise RuntimeConfigError(f"the plan has {config.stages} stages x {config.replicas} replicas = "
                                 f"{config.world_size} workers, but WORLD_SIZE is {world_size}")
    torch.set_num_threads(config.threads)
    use_emulated_links(config.cluster, config.layout, config.time_scale)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=config.comm_timeout_s))
    layout = config.layout
    watchdog = Watchdog(_store_client(config.heartbeat_timeout_s), _store_client(config.heartbeat_timeout_s),
                        rank, world_size,
                        lambda r: layout.describe(r, config.cluster.device_names),
                        config.heartbeat_interval_s, config.heartbeat_timeout_s)
    watchdog.start()
    worker_box: list[Worker] = []
    try:
        records = _train(config, rank, watchdog, worker_box, tokens)
    except Exception as exc:
        waiting = worker_box[0].transport.waiting_on if worker_box else None
        where = f"at step {watchdog.completed_steps + 1}" + (f" while waiting for {waiting}" if waiting else "")
        message = f"{layout.describe(rank)} failed {where}: {type(exc).__name__}: {exc}"
        if isinstance(exc, GeotrainError):  # a user-level error (bad checkpoint...): every rank sees it
            watchdog.post_abort(message)
            raise
        # Most likely a peer died and gloo noticed first: give the watchdog the time it needs to name
        # the lost rank (it exits this process itself); only then blame ourselves.
        deadline = time.monotonic() + config.heartbeat_timeout_s + 4 * config.heartbeat_interval_s
        while time.monotonic() < deadline:
            time.sleep(config.heartbeat_interval_s)
        watchdog.post_abort(message)
        print(f"geotrain worker: {message}", file=sys.stderr, flush=True)
        os._exit(EXIT_WORKER_ERROR)
    dist.barrier()
    watchdog.stop()
    dist.destroy_process_group()
    return records
