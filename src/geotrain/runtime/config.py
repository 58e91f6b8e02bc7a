"""What a training run is: the plan on a cluster and the sections of settings (runtime/sections.py).

One frozen `RuntimeConfig` travels to every worker (pickled by the launcher, or rebuilt from the same
command line by every torchrun worker). Each section validates itself; the rules that span sections
live in `RuntimeConfig.__post_init__`; the pairs of settings that do not run together are one table
(runtime/composition.py). Validated here, trusted inside the workers.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geotrain.cluster import Cluster
from geotrain.cost import AssignmentError, UnknownGpuError, as_assignment, device_peak_flops, stage_speeds
from geotrain.runtime.batch_shares import BatchSharesError, batch_shares, parse_batch_shares
from geotrain.runtime.delta_wire import delta_wire_refusal
from geotrain.runtime.composition import composition_refusal
from geotrain.runtime.elastic.chaos import ChaosSpecError, check_sites, parse_chaos
from geotrain.runtime.elastic.rules import check_elastic, sleeps_gpu_speed
from geotrain.runtime.layout import Layout, LayoutError
from geotrain.runtime.pipeline_schedules import LOOPED_SCHEDULES
from geotrain.runtime.sharded import check_sharded
from geotrain.runtime.sections import (DEFAULT_SEQ_LEN, CheckpointSection, CommSection, DataSection,
                                       EmulationSection, ModelSection, OptimSection, ReliabilitySection, RunSection,
                                       RuntimeConfigError, ScheduleSection, Section)
from geotrain.runtime.training_data import data_identity
from geotrain.sync import (ExchangeOptions, HeterogeneityOptions, OuterOptions, StreamingOptions, SyncError,
                           SyncOptions)

__all__ = ["RuntimeConfig", "RuntimeConfigError", "ModelSection", "OptimSection", "DEFAULT_SEQ_LEN"]

SYNC_OPTION_KEYS = {
    "exchange.codec": "comm.dp_codec", "exchange.hierarchical": "comm.dp_hierarchical",
    "optimizer": "optim.optimizer", "onebit_warmup_steps": "optim.onebit_warmup_steps",
    "clip_grad_norm": "optim.clip_grad_norm", "outer.sync_every": "optim.sync_every",
    "outer.sync_moments": "optim.sync_moments", "outer.moment_syncs": "optim.moment_syncs",
    "outer.outer_state": "optim.outer_state",
    "streaming.fragments": "optim.fragments", "streaming.fragment_split": "optim.fragment_split",
    "streaming.delay": "optim.sync_delay", "streaming.mix": "optim.sync_mix", "streaming.landing": "optim.sync_landing",
    "streaming.warmup": "optim.sync_warmup", "heterogeneity.local_steps": "optim.local_steps",
    "heterogeneity.outer_sync": "optim.outer_sync", "heterogeneity.async_merge": "optim.async_merge",
    "heterogeneity.async_staleness_power": "optim.async_staleness_power",
}
"""SyncOptions field (dotted through its section, SyncError.fields) -> the config key it comes from
(RuntimeConfig.sync_options), to name it in errors."""


@dataclass(frozen=True, eq=False)
class RuntimeConfig:
    """A run: the plan's `assignment` of cluster devices to (stage, replica) slots, and the sections.

    Build it from sections, or with `RuntimeConfig.of(cluster, assignment, steps=3, dp_codec="fp16")`
    (each setting by its key; keys are unique across sections). Derived sizes (stages, replicas,
    world_size, microbatch_size, stages_per_rank, pipeline_stages, sequence_length) live here.
    """

    cluster: Cluster
    assignment: np.ndarray
    plan_name: str = "plan"
    run: RunSection = field(default_factory=RunSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    comm: CommSection = field(default_factory=CommSection)
    optim: OptimSection = field(default_factory=OptimSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    reliability: ReliabilitySection = field(default_factory=ReliabilitySection)
    emulation: EmulationSection = field(default_factory=EmulationSection)
    shards: np.ndarray | None = None
    """A sharded plan's (stages, replicas, K) devices (`plan --shards K`; runtime/layout.py numbers their ranks),
    None: one device per slot."""

    def __post_init__(self) -> None:
        shape = np.shape(self.assignment)
        if len(shape) != 2:
            raise RuntimeConfigError(f"assignment must be a (stages, replicas) array, got shape {shape}")
        try:
            assignment = as_assignment(self.assignment, shape[0], shape[1], self.cluster.n_devices)
        except AssignmentError as exc:
            raise RuntimeConfigError(f"plan does not fit cluster {self.cluster.name!r}: {exc}") from None
        try:
            layout = Layout(assignment, self.shards)
        except LayoutError as exc:
            raise RuntimeConfigError(f"plan does not fit cluster {self.cluster.name!r}: {exc}") from None
        object.__setattr__(self, "assignment", layout.assignment)
        object.__setattr__(self, "shards", layout.shards)
        for section in section_types():
            if not isinstance(getattr(self, section.SECTION), section):
                raise RuntimeConfigError(f"{section.SECTION} must be a {section.__name__}, "
                                         f"got {getattr(self, section.SECTION)!r}")
        self._check_across()

    def _check_across(self) -> None:
        """The rules that span sections (or need the plan's shape or the cluster)."""
        comm, stages = self.comm, self.stages
        refusal = composition_refusal(self)  # the pairs of settings that do not run together (one table)
        if refusal is not None:
            raise RuntimeConfigError(refusal)
        check_sharded(self)  # a sharded plan's own conditions (after the table: its pairs speak first)
        on_gpu = self.run.device == "cuda" or (self.run.device == "auto" and torch.cuda.is_available())
        if self.optim.outer_sync != "sync" and self.optim.outer_state == "host" and on_gpu:
            raise RuntimeConfigError(f"--outer-state host with --outer-sync {self.optim.outer_sync} on --device "
                                     f"{self.run.device}: not built: the asynchronous sync keeps its flat anchor "
                                     "beside the parameters (on the CPU it is host memory already); use --outer-state "
                                     "device")
        for key, specs, length in (("dp_codecs", comm.dp_codecs, stages), ("pp_codecs", comm.pp_codecs, stages - 1)):
            if specs and len(specs) != length:
                raise RuntimeConfigError(f"comm.{key} must be {length} codec specs (or empty), "
                                         f"got {[str(s) for s in specs]}")
        if len(set(comm.pp_codecs)) > 1 and self.stages_per_rank > 1:
            raise RuntimeConfigError(f"comm.pp_codecs: per-cut activation codecs {[str(s) for s in comm.pp_codecs]} "
                                     f"need one virtual stage per rank; schedule {self.schedule.schedule!r} loops "
                                     f"{self.stages_per_rank} (use --pp-codec)")
        refusal = delta_wire_refusal(self)
        if refusal is not None:
            raise RuntimeConfigError(refusal)
        cuts = self.schedule.split_boundaries
        if cuts and len(cuts) != stages + 1:
            raise RuntimeConfigError(f"schedule.split_boundaries must be {stages + 1} increasing cut points from 0 "
                                     f"(or empty), got {cuts!r}")
        if self.schedule.schedule in LOOPED_SCHEDULES and self.schedule.microbatches % stages:
            raise RuntimeConfigError(f"schedule.microbatches must be a multiple of the {stages} stages with schedule "
                                     f"{self.schedule.schedule!r}, got {self.schedule.microbatches}")
        self.batch_shares()
        self.split_weights()  # every device's gpu type must be known (UnknownGpuError names it) before launch
        self.compute_scale()
        emulation = self.emulation
        if emulation.emulate_gpu_speed and not emulation.time_scale > 0 and not sleeps_gpu_speed(self):
            raise RuntimeConfigError(f"emulation.emulate_gpu_speed scales the emulated compute, but "
                                     f"emulation.time_scale {emulation.time_scale!r} runs without emulation; give a "
                                     f"time scale > 0 (at 0 only elastic asynchronous groups run it: --elastic "
                                     f"--outer-sync async*)")
        if self.model.preset and self.model.gpt.n_layer + 2 < self.pipeline_stages:
            raise RuntimeConfigError(f"model {self.model.model_name!r}: cannot cut {self.model.gpt.n_layer + 2} layers "
                                     f"into {self.pipeline_stages} stages ({stages} x {self.stages_per_rank} virtual)")
        if self.reliability.chaos is not None:  # every run: a fixed site must be one of the plan's replicas
            try:
                check_sites(parse_chaos(self.reliability.chaos), self.replicas)
            except ChaosSpecError as exc:
                raise RuntimeConfigError(f"reliability.chaos: {exc}") from None
        check_elastic(self)
        for stage in range(stages):  # last, after the specific messages: any sync no implementation runs
            try:
                self.sync_options(stage)
            except SyncError as exc:
                keys = ", ".join(SYNC_OPTION_KEYS[field] for field in exc.fields) or f"stage {stage}'s gradient sync"
                where = f" (stage {stage})" if comm.dp_codecs and exc.fields else ""
                raise RuntimeConfigError(f"{keys}{where}: {str(exc).removeprefix('SyncOptions: ')}") from None

    @classmethod
    def of(cls, cluster: Cluster, assignment: Any, plan_name: str = "plan", shards: Any = None,
           **settings: Any) -> RuntimeConfig:
        """A config with each setting given by its key (e.g. steps=3, dp_codec="fp16"); the rest default.
        `shards`: a sharded plan's (stages, replicas, K) devices."""
        return cls(cluster, assignment, plan_name, **build_sections(nest_settings(settings)), shards=shards)

    def sections(self) -> dict[str, Section]:
        """The sections by name, in file order."""
        return {section.SECTION: getattr(self, section.SECTION) for section in section_types()}

    def for_stage(self, stage: int) -> RuntimeConfig:
        """This config with `stage`'s DP codec as the only one (what builds that stage's exchange)."""
        if not self.comm.dp_codecs:
            return self
        comm = replace(self.comm, dp_codec=self.comm.stage_dp_codec(stage), dp_codecs=())
        return replace(self, comm=comm)

    def sync_options(self, stage: int) -> SyncOptions:
        """`stage`'s gradient-sync options (geotrain.sync): the one place that maps the run's settings
        onto them. SyncError for a combination no sync implements."""
        optim, comm = self.optim, self.comm
        return SyncOptions(
            ExchangeOptions(codec=comm.stage_dp_codec(stage), error_feedback=comm.error_feedback,
                            hierarchical=comm.dp_hierarchical),
            optimizer=optim.optimizer, lr=optim.lr, total_steps=self.run.steps,
            onebit_warmup_steps=optim.onebit_warmup_steps, clip_grad_norm=optim.clip_grad_norm,
            outer=OuterOptions(sync_every=optim.sync_every, outer_lr=optim.outer_lr,
                               outer_momentum=optim.outer_momentum, sync_moments=optim.sync_moments,
                               moment_syncs=optim.moment_syncs, outer_state=optim.outer_state),
            streaming=StreamingOptions(fragments=optim.fragments, fragment_split=optim.fragment_split,
                                       delay=optim.sync_delay, mix=optim.sync_mix, landing=optim.sync_landing,
                                       warmup=optim.sync_warmup),
            heterogeneity=HeterogeneityOptions(local_steps=optim.local_steps,
                                               local_steps_prior_s=self._step_prior_s(),
                                               outer_sync=optim.outer_sync, async_merge=optim.async_merge,
                                               async_staleness_power=optim.async_staleness_power))

    def _step_prior_s(self) -> tuple[float, ...] | None:
        """Adaptive local steps: 1 / peak FLOP/s of each replica's slowest device over its stages (replica order; the
        same on every stage, so that a replica's stages share the first period alike), the first period's speeds
        before any step is measured; None otherwise or when a GPU type is unknown."""
        if self.optim.local_steps != "adaptive":
            return None
        try:
            peaks = device_peak_flops(self.cluster)
        except UnknownGpuError:
            return None
        return tuple(float(max(1.0 / peaks[d] for d in self.assignment[:, r])) for r in range(self.replicas))

    def split_weights(self) -> tuple[float, ...] | None:
        """Relative speed of each of the S x V pipeline stages for split_by_speed (virtual stage v runs on
        pp-rank v mod S): the stage's slowest replica's peak FLOP/s (cluster gpu types, cost/gpus.py) over
        the fastest stage's. None without split_by_speed or when every stage is alike (the plain split)."""
        if not self.schedule.split_by_speed:
            return None
        speeds = stage_speeds(self.assignment, self._peak_flops("split by speed"))
        if np.all(speeds == speeds[0]):
            return None
        relative = speeds / speeds.max()
        return tuple(float(relative[v % self.stages]) for v in range(self.pipeline_stages))

    def batch_shares(self) -> tuple[int, ...]:
        """Sequences per replica per iteration (R ints summing to R x batch_size; runtime/batch_shares.py)."""
        rule = parse_batch_shares(self.schedule.batch_shares)
        if rule == "speed":
            self._peak_flops("batch shares by speed")
        try:
            return batch_shares(rule, self.cluster, self.assignment, self.schedule.batch_size,
                                self.schedule.microbatches)
        except BatchSharesError as exc:
            raise RuntimeConfigError(f"schedule.{exc}") from None

    def compute_scale(self) -> tuple[float, ...] | None:
        """With emulate_gpu_speed, one factor per cluster device: the cluster's fastest GPU's peak FLOP/s over
        the device's (cost/gpus.py), by which the emulator multiplies that device's measured compute (the
        fastest GPU computes at this machine's speed). None without emulate_gpu_speed."""
        if not self.emulation.emulate_gpu_speed:
            return None
        peaks = self._peak_flops("emulate GPU speed")
        return tuple(float(k) for k in peaks.max() / peaks)  # cost.device_slowdowns

    def _peak_flops(self, purpose: str) -> np.ndarray:
        """(N,) peak FLOP/s of the cluster's devices; an unknown gpu type is a one-line config error."""
        try:
            return device_peak_flops(self.cluster)
        except UnknownGpuError as exc:
            raise RuntimeConfigError(f"{purpose} on cluster {self.cluster.name!r}: {exc}") from None

    @cached_property
    def layout(self) -> Layout:
        return Layout(self.assignment, self.shards)

    @property
    def stages(self) -> int:
        return self.layout.stages

    @property
    def replicas(self) -> int:
        return self.layout.replicas

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def microbatch_size(self) -> int:
        return self.schedule.batch_size // self.schedule.microbatches

    @property
    def stages_per_rank(self) -> int:
        """Virtual stages per rank (V)."""
        return self.schedule.stages_per_rank

    @property
    def pipeline_stages(self) -> int:
        """Stages of one replica's pipeline: S x V."""
        return self.stages * self.stages_per_rank

    @property
    def sequence_length(self) -> int:
        """Tokens per training sequence: --seq-len, else a preset's context, else DEFAULT_SEQ_LEN."""
        if self.model.seq_len is not None:
            return int(self.model.seq_len)
        return self.model.gpt.context if self.model.preset else DEFAULT_SEQ_LEN

    @cached_property
    def data_identity(self) -> dict[str, Any]:
        """The data of the run (the world's seed, or every data file's size and sha256), hashed once."""
        return data_identity(self.data.data, self.data.data_seed, self.data.val_fraction)

    def model_identity(self) -> dict[str, Any]:
        """The model of the run: a preset's config, or the spec and the sha256 of the file it names."""
        name = self.model.model_name
        if self.model.preset:
            return {"spec": name, **asdict(self.model.gpt)}
        target = name[3:] if name.startswith("hf:") else name.rpartition(":")[0]
        path = Path(target)
        file = path / "config.json" if path.is_dir() else path
        digest = hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else None
        return {"spec": name, "sha256": digest}

    def identity(self) -> dict[str, Any]:
        """What must match for a checkpoint to be resumed (the numerics; not the cluster or the
        device placement, which change timing only)."""
        comm, schedule, optim = self.comm, self.schedule, self.optim
        per_link = {key: [str(s) for s in value] for key, value in (("dp_codecs", comm.dp_codecs),
                                                                     ("pp_codecs", comm.pp_codecs)) if value}
        shards = {"shards": self.layout.k} if self.shards is not None else {}
        return {"stages": self.stages, "replicas": self.replicas, **shards, "model": self.model_identity(),
                "data": self.data_identity,
                "steps": self.run.steps, "microbatches": schedule.microbatches, "batch_size": schedule.batch_size,
                "seq_len": self.sequence_length, "split": schedule.split, "virtual_stages": self.stages_per_rank,
                "precision": self.run.precision,
                "lr": optim.lr, "schedule": schedule.schedule, "dp_codec": str(comm.dp_codec),
                "pp_codec": str(comm.pp_codec),
                "error_feedback": comm.error_feedback, "seed": self.run.seed, "data_seed": self.data.data_seed,
                "optimizer": optim.optimizer, "onebit_warmup_steps": optim.onebit_warmup_steps,
                "clip_grad_norm": optim.clip_grad_norm, **per_link,
                **({"split_by_speed": True} if schedule.split_by_speed else {}),
                **({"split_boundaries": list(schedule.split_boundaries)} if schedule.split_boundaries else {}),
                **({"dp_hierarchical": True} if comm.dp_hierarchical else {}),
                **({"sync_every": optim.sync_every, "outer_lr": optim.outer_lr, "outer_momentum": optim.outer_momentum}
                   if optim.sync_every is not None else {}),
                # streaming DiLoCo's settings change the numerics; absent at their defaults (blocking DiLoCo)
                **({"fragments": optim.fragments, "sync_delay": optim.sync_delay, "sync_mix": optim.sync_mix}
                   if (optim.fragments, optim.sync_delay, optim.sync_mix) != (1, 0, 0.0) else {}),
                **({"sync_landing": optim.sync_landing} if optim.sync_landing != "mix" else {}),
                **({"sync_warmup": optim.sync_warmup} if optim.sync_warmup else {}),
                **({"sync_moments": True} if optim.sync_moments else {}),
                **({"moment_syncs": optim.moment_syncs} if optim.moment_syncs is not None else {})}

    def to_json(self) -> dict[str, Any]:
        return {**self.identity(), "model_name": self.model.model_name, "device": self.run.device,
                "cluster": self.cluster.name, "assignment": self.assignment.tolist(),
                **({"shards_devices": self.shards.tolist()} if self.shards is not None else {}),
                "time_scale": self.emulation.time_scale, "plan": self.plan_name}


def section_types() -> tuple[type[Section], ...]:
    """The section classes of RuntimeConfig, in file order."""
    return tuple(f.default_factory for f in fields(RuntimeConfig) if f.name not in ("cluster", "assignment",
                                                                                       "plan_name", "shards"))


def setting_keys() -> dict[str, str]:
    """Section name of every setting key (keys are unique across sections)."""
    return {f.name: section.SECTION for section in section_types() for f in fields(section)}


def nest_settings(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{key: value} as {section: {key: value}}; an unknown key is a one-line error."""
    owners = setting_keys()
    nested: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        if key not in owners:
            raise RuntimeConfigError(f"unknown setting {key!r} (known: {', '.join(owners)})")
        nested.setdefault(owners[key], {})[key] = value
    return nested


def build_sections(settings: dict[str, dict[str, Any]]) -> dict[str, Section]:
    """Every section from {section: {key: value}} (missing sections and keys: their defaults)."""
    return {section.SECTION: section(**settings.get(section.SECTION, {})) for section in section_types()}
