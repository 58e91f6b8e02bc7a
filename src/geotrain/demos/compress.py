"""The seed's demo 2: data-parallel training of the tiny GPT with compressed gradients, as tables of data.

Each table is a `TableSpec` (one optimizer recipe, a list of `RunSpec`s); `COMPRESS_TABLES` lists
them, so a new table is one more entry. `run_compress_demo` trains every run and returns the
measured rows; `compress_observations` derives the seed's observations from those numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from geotrain.data import WorldTokens, world_tokens
from geotrain.models import TINY_2LAYER_GPT, GPTConfig
from geotrain.optim import onebit_update_rule
from geotrain.optim.floored_adamw import flooring_rule
from geotrain.sim import (
    ProgressFactory,
    TrainConfig,
    TrainingJob,
    TrainingResult,
    UpdateRuleFactory,
    codec_update_rule,
    train_many,
)

TOPK_1PCT = {"fraction": 0.01}
SGD_LR = 0.1
"""The seed's SGD lr of 0.3 (momentum 0.9, no clipping) diverges on our model (NaN loss at step 51 of
300, measured); 0.1 is the largest of 0.1 / 0.3 / 1.0 that trains."""


@dataclass(frozen=True)
class RunSpec:
    """One training run of a table. `update_rule` replaces the codec exchange (e.g. 1-bit Adam)."""

    key: str
    label: str
    codec: str = "none"
    codec_params: Mapping[str, Any] = field(default_factory=dict)
    error_feedback: bool = False
    update_rule: UpdateRuleFactory = codec_update_rule


@dataclass(frozen=True)
class TableSpec:
    """One optimizer recipe and the runs trained with it; lr None: the optimizer's default peak lr."""

    key: str
    title: str
    optimizer: str
    clip_norm: float | None
    runs: tuple[RunSpec, ...]
    lr: float | None = None


ADAMW_TABLE = TableSpec("adamw", "(a) AdamW + gradient clipping (lecture 1's recipe)", "adamw", 1.0, (
    RunSpec("none", "no compression (fp32)"),
    RunSpec("fp16", "fp16", "fp16"),
    RunSpec("int8", "int8 (one scale per tensor)", "int8"),
    RunSpec("int8-block", "int8 (one scale per 256 values)", "int8-block", {"block_size": 256}),
    RunSpec("topk", "top-1%, no error feedback", "topk", TOPK_1PCT),
    RunSpec("topk-ef", "top-1%, error feedback", "topk", TOPK_1PCT, True),
    RunSpec("sign", "sign only, no error feedback", "sign"),
    RunSpec("sign-ef", "sign only, error feedback", "sign", {}, True),
))
SGD_TABLE = TableSpec("sgd", "(b) SGD with momentum, no clipping (the classic error-feedback setting)", "sgd", None, (
    RunSpec("none", "no compression (fp32)"),
    RunSpec("topk", "top-1%, no error feedback", "topk", TOPK_1PCT),
    RunSpec("topk-ef", "top-1%, error feedback", "topk", TOPK_1PCT, True),
), lr=SGD_LR)
ONEBIT_TABLE = TableSpec("onebit", "(c) 1-bit Adam (Tang et al. 2021) vs AdamW, equal steps", "adamw", 1.0, (
    RunSpec("none", "AdamW, fp32 gradients"),
    RunSpec("onebit", "OneBitAdam: fp32 for 5% of steps, then 1-bit momentum", update_rule=onebit_update_rule()),
    RunSpec("sign", "AdamW, sign only, no error feedback", "sign"),
    # OneBitAdam's effects one at a time, with fp32 gradients: its variance floor alone, then also frozen
    RunSpec("adamw-floor", "AdamW + OneBitAdam's variance floor 0.1, fp32", update_rule=flooring_rule(0.1)),
    RunSpec("adamw-floor-frozen", "AdamW + floor 0.1, variance frozen at 5%, fp32",
            update_rule=flooring_rule(0.1, freeze_fraction=0.05)),
))
COMPRESS_TABLES: tuple[TableSpec, ...] = (ADAMW_TABLE, SGD_TABLE, ONEBIT_TABLE)


@dataclass(frozen=True)
class CompressDemoConfig:
    """Steps, workers (each takes batch / workers sequences of every batch), seed, model, world seed, tables."""

    steps: int = 300
    workers: int = 4
    batch: int = 32
    seed: int = 0
    world_seed: int = 0
    model: GPTConfig = TINY_2LAYER_GPT
    tables: tuple[TableSpec, ...] = COMPRESS_TABLES

    def train_config(self, table: TableSpec, run: RunSpec) -> TrainConfig:
        return TrainConfig(codec=run.codec, codec_params=dict(run.codec_params), error_feedback=run.error_feedback,
                           optimizer=table.optimizer, lr=table.lr, clip_norm=table.clip_norm, steps=self.steps,
                           workers=self.workers, batch=self.batch, seed=self.seed, model=self.model)


@dataclass(frozen=True)
class RunRow:
    """A measured run: bytes per value from real payload sizes, validation bits per character."""

    table: str
    key: str
    label: str
    codec: str
    error_feedback: bool
    bytes_per_value: float
    traffic_vs_fp32: float
    val_bpc: float
    final_loss: float
    total_bytes_sent: int
    seconds: float
    diverged_at_step: int | None

    @classmethod
    def from_result(cls, table: TableSpec, run: RunSpec, result: TrainingResult) -> RunRow:
        return cls(table.key, run.key, run.label, run.codec, run.error_feedback, result.bytes_per_value,
                   result.traffic_vs_fp32, result.val_bpc, result.losses[-1], result.total_bytes_sent,
                   result.seconds, result.diverged_at_step)


@dataclass(frozen=True)
class Observation:
    """One of the seed's claims checked on this run's numbers: `holds` and a sentence with the numbers."""

    key: str
    holds: bool
    text: str


@dataclass(frozen=True)
class CompressDemo:
    config: CompressDemoConfig
    n_params: int
    rows: tuple[RunRow, ...]
    seconds: float

    def row(self, table: str, key: str) -> RunRow | None:
        return next((r for r in self.rows if r.table == table and r.key == key), None)

    def table_rows(self, table: str) -> list[RunRow]:
        return [r for r in self.rows if r.table == table]

    def to_json(self) -> dict[str, Any]:
        tables = [{"key": t.key, "title": t.title, "optimizer": t.optimizer, "clip_norm": t.clip_norm,
                   "lr": self.config.train_config(t, t.runs[0]).peak_lr if t.runs else t.lr,
                   "rows": [asdict(r) for r in self.table_rows(t.key)]} for t in self.config.tables]
        return {"demo": "compress", "steps": self.config.steps, "workers": self.config.workers,
                "batch": self.config.batch, "seed": self.config.seed, "params": self.n_params,
                "model": asdict(self.config.model), "tables": tables,
                "observations": [asdict(o) for o in compress_observations(self)], "seconds": self.seconds}


def run_compress_demo(config: CompressDemoConfig = CompressDemoConfig(), data: WorldTokens | None = None,
                      progress: ProgressFactory | None = None, processes: int = 1,
                      threads_per_process: int = 1) -> CompressDemo:
    """Train every run of every table (see `train_many` for `processes`); one progress bar per run."""
    started = time.perf_counter()
    data = world_tokens(config.world_seed) if data is None else data
    specs = [(table, run) for table in config.tables for run in table.runs]
    # A run repeated in another table (same config, same update rule) is trained once.
    keys = [repr((config.train_config(table, run), run.update_rule)) for table, run in specs]
    first = {key: i for i, key in reversed(list(enumerate(keys)))}
    unique = sorted(set(first.values()))
    jobs = [TrainingJob(config.train_config(*specs[i]), specs[i][1].update_rule,
                        f"{specs[i][0].key}: {specs[i][1].label}") for i in unique]
    trained = dict(zip(unique, train_many(jobs, data, processes, threads_per_process, progress), strict=True))
    results = [trained[first[key]] for key in keys]
    rows = tuple(RunRow.from_result(table, run, result) for (table, run), result in zip(specs, results, strict=True))
    n_params = results[0].n_params if results else 0
    return CompressDemo(config, n_params, rows, time.perf_counter() - started)


def compress_observations(demo: CompressDemo) -> list[Observation]:
    """The seed's observations, each stated with this run's numbers (skipped when its rows are missing)."""
    checks: Iterable[Callable[[CompressDemo], Observation | None]] = (
        _fp16_matches_fp32, _int8_block_recovers, _topk_hurts, _ef_helps_sgd_more, _sign_prefers_no_ef,
        _onebit_matches_adamw, _onebit_floor_share)
    return [obs for check in checks if (obs := check(demo)) is not None]


def _fp16_matches_fp32(demo: CompressDemo) -> Observation | None:
    base, fp16 = demo.row("adamw", "none"), demo.row("adamw", "fp16")
    if base is None or fp16 is None:
        return None
    diff = fp16.val_bpc - base.val_bpc
    holds = abs(diff) < 0.02
    return Observation("fp16", holds, f"fp16 {'is' if holds else 'is not'} within 0.02 bpc of fp32 "
                       f"({fp16.val_bpc:.4f} vs {base.val_bpc:.4f}, {diff:+.4f}) at "
                       f"{fp16.traffic_vs_fp32:.2f}x the traffic.")


def _int8_block_recovers(demo: CompressDemo) -> Observation | None:
    base, int8, block = demo.row("adamw", "none"), demo.row("adamw", "int8"), demo.row("adamw", "int8-block")
    if base is None or int8 is None or block is None:
        return None
    gap, block_gap = int8.val_bpc - base.val_bpc, block.val_bpc - base.val_bpc
    head = (f"int8 with one scale per tensor: {int8.val_bpc:.4f} ({gap:+.4f} vs fp32); one scale per 256 values: "
            f"{block.val_bpc:.4f} ({block_gap:+.4f})")
    if gap <= 0:
        return Observation("int8", False, head + ": per-tensor int8 is no worse than fp32 here.")
    recovered = 1.0 - block_gap / gap
    holds = gap > 0.02 and recovered > 0.5
    return Observation("int8", holds, head + f", recovering {recovered:.0%} of the gap for "
                       f"{block.bytes_per_value - int8.bytes_per_value:.4f} more bytes per value.")


def _topk_hurts(demo: CompressDemo) -> Observation | None:
    base, topk = demo.row("adamw", "none"), demo.row("adamw", "topk")
    if base is None or topk is None:
        return None
    gap = topk.val_bpc - base.val_bpc
    sends = demo.config.steps * topk.bytes_per_value / 8  # 8 wire bytes (index + value) per value sent
    return Observation("topk", gap > 0.1, f"top-1% without error feedback: {topk.val_bpc:.4f} vs {base.val_bpc:.4f} "
                       f"uncompressed under AdamW ({gap:+.4f}); in {demo.config.steps} steps a value is sent "
                       f"{sends:.1f} times on average.")


def _ef_helps_sgd_more(demo: CompressDemo) -> Observation | None:
    rows = [demo.row(t, k) for t in ("sgd", "adamw") for k in ("topk", "topk-ef")]
    if any(r is None for r in rows):
        return None
    sgd, sgd_ef, adamw, adamw_ef = (r.val_bpc for r in rows if r is not None)
    gain_sgd, gain_adamw = sgd - sgd_ef, adamw - adamw_ef
    holds = gain_sgd > gain_adamw
    return Observation("ef-topk", holds, f"error feedback on top-1%: SGD with momentum {sgd:.4f} -> {sgd_ef:.4f} "
                       f"(gain {gain_sgd:+.4f}), AdamW {adamw:.4f} -> {adamw_ef:.4f} (gain {gain_adamw:+.4f}): it helps "
                       f"{'more under SGD' if holds else 'at least as much under AdamW'}.")


def _sign_prefers_no_ef(demo: CompressDemo) -> Observation | None:
    sign, sign_ef = demo.row("adamw", "sign"), demo.row("adamw", "sign-ef")
    if sign is None or sign_ef is None:
        return None
    holds = sign.val_bpc < sign_ef.val_bpc
    return Observation("sign", holds, f"sign only under AdamW: {sign.val_bpc:.4f} without error feedback, "
                       f"{sign_ef.val_bpc:.4f} with: {'without' if holds else 'with'} is better by "
                       f"{abs(sign.val_bpc - sign_ef.val_bpc):.4f} bpc.")


def _onebit_matches_adamw(demo: CompressDemo) -> Observation | None:
    adamw, onebit = demo.row("onebit", "none"), demo.row("onebit", "onebit")
    if adamw is None or onebit is None:
        return None
    change = onebit.val_bpc / adamw.val_bpc - 1.0
    saving = adamw.bytes_per_value / onebit.bytes_per_value
    holds = change <= 0.03 and saving >= 10.0
    return Observation("onebit", holds, f"1-bit Adam: {onebit.val_bpc:.4f} bpc vs AdamW {adamw.val_bpc:.4f} "
                       f"({change:+.1%}) with {saving:.1f}x less traffic over the whole run, warm-up included "
                       f"(target: within 3% at >= 10x).")


def _onebit_floor_share(demo: CompressDemo) -> Observation | None:
    rows = [demo.row("onebit", k) for k in ("none", "adamw-floor", "adamw-floor-frozen", "onebit")]
    if any(r is None for r in rows):
        return None
    adamw, floor, frozen, onebit = (r.val_bpc for r in rows if r is not None)
    gain = adamw - onebit
    share = (adamw - floor) / gain if gain > 0 else float("nan")
    return Observation("onebit-floor", gain > 0, f"OneBitAdam vs AdamW {onebit - adamw:+.4f} bpc; AdamW with its variance "
                       f"floor alone {floor - adamw:+.4f}, floor + frozen variance (no 1-bit) {frozen - adamw:+.4f}: "
                       f"the floor accounts for {share:.0%} of OneBitAdam's gain, 1-bit compression for "
                       f"{onebit - frozen:+.4f} bpc.")
