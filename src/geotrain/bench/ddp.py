"""Data-parallel training of the tiny GPT in real processes (gloo), one row per way of communicating.

Every row trains the same model from the same seed on the same batches (rank r takes rows
[r*b, (r+1)*b) of each global batch, as the in-process simulation `geotrain.sim` does) and reports
what each rank handed to the process group per step, the wire-model bytes, validation bits per
character and wall seconds. Rows:
- torch's own DDP hooks (allreduce = plain fp32 DDP, fp16_compress_hook, powerSGD_hook with one
  bucket, which is the only layout where it does not hang on gloo), measured by intercepting
  torch.distributed's Python collectives;
- geotrain codecs as DDP hooks (`geotrain.ddp.register_codec_hook`; `powersgd` is distributed PowerSGD
  in DDP's default bucket layout, which has 2 buckets for the demo GPT);
- OneBitAdam over `TorchCollective` (no DDP: the optimizer communicates).
All rows run one after another inside the same 4 worker processes, so they share the machine's state.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from geotrain.errors import GeotrainError
from geotrain.models import TINY_2LAYER_GPT, GPTConfig
from geotrain.sim import TrainConfig

EXCHANGES = ("codec-hook", "torch-hook", "onebit")
TORCH_HOOKS = ("allreduce", "fp16", "powersgd")
MODELS = {"base": TINY_2LAYER_GPT, "small": GPTConfig(n_layer=2, d_model=64, n_head=4, context=64)}
ONE_BUCKET_MB = 1024.0  # far above the tiny GPT's ~3 MB of gradients: DDP makes a single bucket


class DDPBenchError(GeotrainError, ValueError):
    """A bad benchmark option."""


@dataclass(frozen=True)
class DDPRun:
    """One row. `train` holds the recipe (optimizer, schedule, clipping, steps, workers, batch, seed,
    and for codec hooks the codec and error feedback). `exchange` says who communicates:
    codec-hook (our hook; `granularity` tensor|bucket), torch-hook (`torch_hook`, `powersgd_rank`, and
    `powersgd_seed` for torch's PowerSGDState.random_seed, None: the training seed),
    onebit (OneBitAdam with `onebit_warmup` full-precision steps). `bucket_cap_mb` None: DDP's default.
    """

    label: str
    train: TrainConfig
    exchange: str = "codec-hook"
    torch_hook: str = "allreduce"
    powersgd_rank: int = 2
    powersgd_seed: int | None = None
    onebit_warmup: int = 20
    granularity: str = "tensor"
    bucket_cap_mb: float | None = None
    evaluate: bool = True

    def __post_init__(self) -> None:
        if self.exchange not in EXCHANGES:
            raise ValueError(f"exchange must be one of {EXCHANGES}, got {self.exchange!r}")
        if self.torch_hook not in TORCH_HOOKS:
            raise ValueError(f"torch_hook must be one of {TORCH_HOOKS}, got {self.torch_hook!r}")


@dataclass(frozen=True)
class DDPRunResult:
    """What one row measured. Bytes are per rank (all ranks hand the same sizes); per step = mean.

    losses: training loss per step, mean over ranks (rank order, as the simulation averages).
    handed_bytes: bytes handed to collectives; wire_bytes: the ring/all-to-all model of what is sent.
    declared_bytes: payload sizes our codecs declared (None for torch's hooks and OneBitAdam's warm-up
    is included in OneBitAdam's declared count). val_bpc: None when not evaluated.
    buckets_per_step: DDP buckets our PowerSGD hook saw in the last step (None for other rows).
    """

    label: str
    steps: int
    workers: int
    n_params: int
    losses: tuple[float, ...]
    handed_bytes: int
    wire_bytes: float
    declared_bytes: int | None
    collective_calls: int
    val_bpc: float | None
    seconds: float
    rank_losses: tuple[tuple[float, ...], ...] = field(default=(), repr=False)
    buckets_per_step: int | None = None

    @property
    def handed_bytes_per_step(self) -> float:
        return self.handed_bytes / self.steps

    @property
    def wire_bytes_per_step(self) -> float:
        return self.wire_bytes / self.steps

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("rank_losses")
        data.update(handed_bytes_per_step=self.handed_bytes_per_step, wire_bytes_per_step=self.wire_bytes_per_step)
        return data


def run_ddp(runs: Sequence[DDPRun], *, timeout_s: float = 600.0, data_seed: int = 0) -> list[DDPRunResult]:
    """Run `runs` one after another in `workers` processes (all runs must agree on it)."""
    from geotrain.comm import run_workers

    workers = {run.train.workers for run in runs}
    if len(workers) != 1:
        raise ValueError(f"all runs must use the same number of workers, got {sorted(workers)}")
    world_size = workers.pop()
    per_rank = run_workers(_worker, world_size, (tuple(runs), data_seed), timeout_s=timeout_s)
    return [_merge(run, [rank_results[i] for rank_results in per_rank]) for i, run in enumerate(runs)]


def _merge(run: DDPRun, ranks: list[dict[str, Any]]) -> DDPRunResult:
    first = ranks[0]
    if any(r["handed_bytes"] != first["handed_bytes"] for r in ranks):
        raise AssertionError(f"{run.label}: ranks handed different byte counts {[r['handed_bytes'] for r in ranks]}")
    steps = len(first["losses"])
    losses = tuple(sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(steps))
    return DDPRunResult(run.label, steps, len(ranks), first["n_params"], losses, first["handed_bytes"],
                        first["wire_bytes"], first["declared_bytes"], first["calls"], first["val_bpc"],
                        max(r["seconds"] for r in ranks), tuple(tuple(r["losses"]) for r in ranks),
                        first["buckets_per_step"])


def _worker(rank: int, world_size: int, runs: tuple[DDPRun, ...], data_seed: int) -> list[dict[str, Any]]:
    from geotrain.data import world_tokens

    data = world_tokens(data_seed)
    return [train_on_rank(rank, world_size, run, data) for run in runs]


def train_on_rank(rank: int, world_size: int, run: DDPRun, data: Any) -> dict[str, Any]:
    """One row on this rank (the process group must exist). Returns plain data (see DDPRunResult)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from geotrain.comm import CommLedger, clip_grad_norm_, intercept_torch_collectives
    from geotrain.data import get_batch
    from geotrain.models import bits_per_char, lr_at, make_model
    from geotrain.sim import assign_flat_grad

    config = run.train
    if config.batch % world_size or config.workers != world_size:
        raise ValueError(f"{run.label}: batch {config.batch} / workers {config.workers} do not fit {world_size} ranks")
    model = make_model(config.model, seed=config.seed)
    params = list(model.parameters())
    forward, optimizer, ledger, hook_state = _communication(run, model, params)
    generator = torch.Generator().manual_seed(config.seed + 1)
    shard = config.batch // world_size
    rows = slice(rank * shard, (rank + 1) * shard)
    torch_ledger = CommLedger()
    losses = []
    dist.barrier()
    started = time.perf_counter()
    with intercept_torch_collectives(torch_ledger) if run.exchange == "torch-hook" else nullcontext():
        for step in range(config.steps):
            x, y = get_batch(data.train, config.batch, config.model.context, generator)
            loss = F.cross_entropy(forward(x[rows]).flatten(0, 1), y[rows].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.clip_norm is not None and run.exchange != "onebit":  # OneBitAdam clips inside
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                clip_grad_norm_([flat], config.clip_norm)  # the simulation's clipping, bit for bit
                assign_flat_grad(params, flat)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, config.steps, config.peak_lr, config.warmup_steps)
            optimizer.step()
            losses.append(loss.item())
    seconds = time.perf_counter() - started
    ledger = torch_ledger if run.exchange == "torch-hook" else ledger
    declared = None
    if hook_state is not None:
        declared = hook_state.declared_bytes
    elif run.exchange == "onebit":
        declared = _onebit_declared(optimizer, config.steps)
    val_bpc = bits_per_char(model, data.val) if rank == 0 and run.evaluate else None
    return {"losses": losses, "handed_bytes": ledger.handed_bytes, "wire_bytes": ledger.wire_bytes,
            "declared_bytes": declared, "calls": sum(ledger.calls.values()), "val_bpc": val_bpc,
            "seconds": seconds, "n_params": sum(p.numel() for p in params),
            "buckets_per_step": getattr(hook_state, "buckets_per_step", None)}


def _communication(run: DDPRun, model: Any, params: list[Any]) -> tuple[Any, Any, Any, Any]:
    """(module to call forward on, optimizer, ledger of our own calls, our hook state or None)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    from geotrain.comm import CommLedger
    from geotrain.ddp import register_codec_hook
    from geotrain.comm import TorchCollective
    from geotrain.optim import OneBitAdam
    from geotrain.sim import make_optimizer

    config = run.train
    if run.exchange == "onebit":
        optimizer = OneBitAdam(params, lr=config.peak_lr, betas=tuple(config.betas), weight_decay=config.weight_decay,
                               warmup_steps=run.onebit_warmup, collective=TorchCollective(),
                               max_grad_norm=config.clip_norm)
        return model, optimizer, optimizer.ledger, None
    ddp = DistributedDataParallel(model, bucket_cap_mb=run.bucket_cap_mb)
    optimizer = make_optimizer(params, config)
    if run.exchange == "codec-hook":
        state = register_codec_hook(ddp, config.codec, config.error_feedback, granularity=run.granularity,
                                    **dict(config.codec_params))
        return ddp, optimizer, state.ledger, state
    if run.torch_hook == "allreduce":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif run.torch_hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        # start_powerSGD_iter=2: compress from the second step (torch's minimum with error feedback).
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=run.powersgd_rank,
                                            start_powerSGD_iter=2, use_error_feedback=True, warm_start=True,
                                            random_seed=config.seed if run.powersgd_seed is None
                                            else run.powersgd_seed)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp, optimizer, CommLedger(), None


def _onebit_declared(optimizer: Any, steps: int) -> int:
    warm = min(steps, optimizer.warmup_steps)
    return warm * optimizer.declared_step_bytes(False) + (steps - warm) * optimizer.declared_step_bytes(True)


# -- the benchmark's rows ------------------------------------------------------------------------

@dataclass(frozen=True)
class DDPBenchConfig:
    """`geotrain bench ddp`: steps per row, ranks, global batch, OneBitAdam warm-up, model shape.
    `only`: keep rows whose label contains one of these strings (the fp32 reference row always runs)."""

    steps: int = 300
    workers: int = 4
    batch: int = 32
    onebit_warmup: int = 20
    seed: int = 0
    model: GPTConfig = TINY_2LAYER_GPT
    timeout_s: float = 3600.0
    only: tuple[str, ...] = ()


def bench_runs(config: DDPBenchConfig) -> list[DDPRun]:
    """The rows of `geotrain bench ddp`, all with the seed's AdamW recipe (lr 3e-3, clip 1.0)."""
    base = TrainConfig(steps=config.steps, workers=config.workers, batch=config.batch, seed=config.seed,
                       model=config.model)

    def ours(label: str, codec: str, error_feedback: bool = False, **params: Any) -> DDPRun:
        return DDPRun(label, replace(base, codec=codec, error_feedback=error_feedback, codec_params=params))

    runs = [
        DDPRun("AdamW, DDP fp32 (torch allreduce_hook)", base, "torch-hook", "allreduce"),
        DDPRun("torch fp16_compress_hook", base, "torch-hook", "fp16"),
        DDPRun("torch powerSGD_hook rank 2, 1 bucket", base, "torch-hook", "powersgd", powersgd_rank=2,
               bucket_cap_mb=ONE_BUCKET_MB),
        DDPRun("torch powerSGD_hook rank 8, 1 bucket", base, "torch-hook", "powersgd", powersgd_rank=8,
               bucket_cap_mb=ONE_BUCKET_MB),
        ours("geotrain fp16", "fp16"),
        ours("geotrain bf16", "bf16"),
        ours("geotrain int8-block", "int8-block"),
        ours("geotrain top-1% + EF", "topk", True, fraction=0.01),
        ours("geotrain sign", "sign"),
        ours("geotrain sign + EF", "sign", True),
        # distributed PowerSGD in DDP's default bucket layout (2 buckets here: torch's hook hangs there),
        # with torch's rows' settings: fp32 for the first 2 steps, min_compression_rate 2, error feedback
        ours("geotrain powersgd rank 2, default buckets", "powersgd", True, rank=2, start_powersgd_iter=2),
        ours("geotrain powersgd rank 8, default buckets", "powersgd", True, rank=8, start_powersgd_iter=2),
        DDPRun(f"OneBitAdam (warm-up {config.onebit_warmup})", base, "onebit", onebit_warmup=config.onebit_warmup),
    ]
    if config.only:
        runs = runs[:1] + [run for run in runs[1:] if any(part in run.label for part in config.only)]
        if len(runs) == 1:
            labels = [run.label for run in bench_runs(replace(config, only=()))]
            raise DDPBenchError(f"no row matches {list(config.only)}; rows: {labels}")
    return runs


@dataclass(frozen=True)
class DDPBench:
    config: DDPBenchConfig
    results: tuple[DDPRunResult, ...]

    def rows(self) -> list[dict[str, Any]]:
        """Per row: label, bytes per step (handed, wire), wire traffic / fp32 DDP, bpc, seconds."""
        reference = self.results[0].wire_bytes_per_step
        return [{"label": r.label, "handed_bytes_per_step": r.handed_bytes_per_step,
                 "wire_bytes_per_step": r.wire_bytes_per_step,
                 "traffic_vs_fp32": r.wire_bytes_per_step / reference if reference else float("nan"),
                 "declared_bytes_match": None if r.declared_bytes is None else r.declared_bytes == r.handed_bytes,
                 "val_bpc": r.val_bpc, "final_loss": r.losses[-1], "seconds": r.seconds,
                 "buckets_per_step": r.buckets_per_step} for r in self.results]

    def to_json(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "rows": self.rows(), "runs": [r.to_json() for r in self.results]}


def run_ddp_bench(config: DDPBenchConfig) -> DDPBench:
    """All rows of `bench_runs(config)` in one launch of `config.workers` processes."""
    return DDPBench(config, tuple(run_ddp(bench_runs(config), timeout_s=config.timeout_s, data_seed=config.seed)))
