"""What a training run is: the plan on a cluster, the model, the schedule, the codecs, the knobs.

One frozen `RuntimeConfig` travels to every worker (pickled by the launcher, or rebuilt from the same
command line by every torchrun worker). Validated here, trusted inside the workers.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geotrain.cluster import Cluster
from geotrain.codecs import CodecError, get_codec, parse_codec_spec
from geotrain.comm import check_reducer_spec
from geotrain.cost import AssignmentError, UnknownGpuError, as_assignment, device_peak_flops, stage_speeds
from geotrain.errors import GeotrainError
from geotrain.models import MODEL_PRESETS, TINY_GPT, GPTConfig
from geotrain.optim.outer import DILOCO_LR, DILOCO_MOMENTUM, OuterStepError, check_outer_settings
from geotrain.optim.registry import RUNTIME_OPTIMIZERS
from geotrain.runtime.layout import Layout
from geotrain.runtime.pipeline import LOOPED_SCHEDULES, PIPELINE_SCHEDULES
from geotrain.runtime.stages import SPLIT_RULES, WIRE_DTYPES
from geotrain.runtime.training_data import data_identity


class RuntimeConfigError(GeotrainError, ValueError):
    """An invalid training option (named with its value and the allowed range)."""


MIN_COMM_TIMEOUT_S = 1.0
"""Shortest accepted gloo timeout (seconds): the rendezvous of freshly started workers takes a few."""

PP_CODECS = tuple(WIRE_DTYPES)
"""Codecs allowed for pipeline activations: torch's pipelining sends the tensors a stage outputs, so an
activation codec is the float dtype the stage casts to (int8-block's wire form is not one: refused)."""

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")
DEFAULT_SEQ_LEN = 128
"""Training sequence length (tokens) when --seq-len is not given and the model does not name a context."""

@dataclass(frozen=True, eq=False)
class RuntimeConfig:
    """A run. Times in seconds; `time_scale` multiplies every emulated link time (0: no emulation).

    `batch_size` is sequences per replica per iteration (global batch = batch_size x replicas), cut
    into `microbatches` equal micro-batches. `optimizer` (optim.registry.RUNTIME_OPTIMIZERS) with `onebit_warmup_steps` full-
    precision steps for onebit-adam; `clip_grad_norm`: clip the gradient of the whole model (all
    stages) to this global L2 norm before the optimizer step (None: off). `stop_after` ends this invocation after that many steps
    (a planned interruption) while the learning-rate schedule still spans `steps`.

    `model_name` is the --model spec (a MODEL_PRESETS name uses `model`; else hf:..., file.py:fn or
    pkg.mod:fn); `data` a corpus path (None: the synthetic world of `data_seed`), `val_fraction` of
    it held out; every `eval_every` steps (0: never) the validation loss over at most `eval_windows`
    windows is recorded. `seq_len` tokens per sequence (None: the preset's context, else 128).
    `split` cuts the layers into stages x `virtual_stages` (None: 2 for the looped schedules, else 1);
    `split_by_speed` weights that cut by each stage's speed (`split_weights`: faster stages take more
    layers); `split_boundaries` is a plan's cut (S + 1 cut points over the plan job's layers), used when
    it fits the model (runtime.stages.stage_boundaries).
    `dp_codecs` / `pp_codecs`: one codec spec per stage's DP group / per stage cut (a plan's codec
    choice); empty means `dp_codec` / `pp_codec` everywhere. `compute_clock`: "wall" or "cpu", how the
    emulated clock counts compute (geotrain.emulate.install.COMPUTE_CLOCKS). `emulate_gpu_speed`: each
    rank's emulated (and reported) compute is its measured compute x `compute_scale()` of its device. `sync_every` H (None: the
    gradients are averaged every step): local SGD with outer steps (geotrain.optim.outer, DiLoCo): each
    replica steps AdamW on its own gradients, and every H steps the stage's DP exchange averages the
    parameter deltas, which an outer Nesterov SGD (`outer_lr`, `outer_momentum`) applies.
    """

    cluster: Cluster
    assignment: np.ndarray
    model: GPTConfig = TINY_GPT
    model_name: str = "tiny"
    steps: int = 20
    microbatches: int = 4
    batch_size: int = 8
    lr: float = 3e-3
    schedule: str = "gpipe"
    dp_codec: str = "none"
    pp_codec: str = "none"
    error_feedback: bool = True
    optimizer: str = "adamw"
    onebit_warmup_steps: int = 5
    clip_grad_norm: float | None = None
    dp_hierarchical: bool = False
    time_scale: float = 1.0
    seed: int = 0
    data_seed: int = 0
    threads: int = 1
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    overwrite: bool = False
    stop_after: int | None = None
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 10.0
    comm_timeout_s: float = 120.0
    plan_name: str = "plan"
    data: str | None = None
    val_fraction: float = 0.1
    eval_every: int = 0
    eval_windows: int = 32
    seq_len: int | None = None
    split: str = "layers"
    split_by_speed: bool = False
    split_boundaries: tuple[int, ...] = ()
    virtual_stages: int | None = None
    device: str = "cpu"
    precision: str = "fp32"
    extra: dict[str, Any] = field(default_factory=dict)
    dp_codecs: tuple[str, ...] = ()
    pp_codecs: tuple[str, ...] = ()
    compute_clock: str = "wall"
    emulate_gpu_speed: bool = False
    sync_every: int | None = None
    outer_lr: float = DILOCO_LR
    outer_momentum: float = DILOCO_MOMENTUM

    def __post_init__(self) -> None:
        shape = np.shape(self.assignment)
        if len(shape) != 2:
            raise RuntimeConfigError(f"assignment must be a (stages, replicas) array, got shape {shape}")
        try:
            assignment = as_assignment(self.assignment, shape[0], shape[1], self.cluster.n_devices)
        except AssignmentError as exc:
            raise RuntimeConfigError(f"plan does not fit cluster {self.cluster.name!r}: {exc}") from None
        object.__setattr__(self, "assignment", Layout(assignment).assignment)
        self._check_numbers()
        self._check_choices()
        for key, specs, length in (("dp_codecs", self.dp_codecs, shape[0]), ("pp_codecs", self.pp_codecs, shape[0] - 1)):
            if not isinstance(specs, tuple) or (specs and len(specs) != length):
                raise RuntimeConfigError(f"{key} must be a tuple of {length} codec specs (or empty), got {specs!r}")
        if len(set(self.pp_codecs)) > 1 and self.stages_per_rank > 1:
            raise RuntimeConfigError(f"per-cut activation codecs {list(self.pp_codecs)} need one virtual stage per "
                                     f"rank; schedule {self.schedule!r} loops {self.stages_per_rank} (use --pp-codec)")
        for spec in (self.pp_codec, *self.pp_codecs):
            if parse_codec_spec(spec)[0] not in PP_CODECS:
                why = (": torch.distributed.pipelining sends the float tensors a stage outputs, and this codec's "
                       "wire form is not one") if spec.split(":")[0] in ("int8", "int8-block", "topk", "randk",
                                                                         "sign", "powersgd") else ""
                raise RuntimeConfigError(f"pipeline codec must be one of {', '.join(PP_CODECS)}, got {spec!r}{why}")
        checks = [("gradient", spec) for spec in (self.dp_codec, *self.dp_codecs)]
        for label, spec in checks + [("pipeline", spec) for spec in (self.pp_codec, *self.pp_codecs)]:
            try:
                if label == "gradient":
                    check_reducer_spec(spec)  # any reducer: a codec, or e.g. powersgd with its own knobs
                else:
                    name, params = parse_codec_spec(spec)
                    get_codec(name, **params)
            except (CodecError, TypeError) as exc:
                raise RuntimeConfigError(f"{label} codec {spec!r}: {exc}") from None
        cuts = self.split_boundaries
        if not isinstance(cuts, tuple) or (cuts and (len(cuts) != shape[0] + 1 or cuts[0] != 0 or any(
                isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b <= a for a, b in zip(cuts, cuts[1:])))):
            raise RuntimeConfigError(f"split_boundaries must be {shape[0] + 1} increasing cut points from 0 "
                                     f"(or empty), got {cuts!r}")
        if not isinstance(self.split_by_speed, bool):
            raise RuntimeConfigError(f"split_by_speed must be true or false, got {self.split_by_speed!r}")
        self.split_weights()  # every device's gpu type must be known (UnknownGpuError names it) before launch
        if self.optimizer not in RUNTIME_OPTIMIZERS:
            raise RuntimeConfigError(f"optimizer must be one of {', '.join(RUNTIME_OPTIMIZERS)}, got {self.optimizer!r}")
        if self.optimizer == "onebit-adam" and parse_codec_spec(self.dp_codec)[0] != "none":
            raise RuntimeConfigError(f"optimizer onebit-adam does its own data-parallel communication; "
                                     f"dp_codec must be none, got {self.dp_codec!r}")
        if self.compute_clock not in ("wall", "cpu"):
            raise RuntimeConfigError(f"compute_clock must be wall or cpu, got {self.compute_clock!r}")
        if not isinstance(self.emulate_gpu_speed, bool):
            raise RuntimeConfigError(f"emulate_gpu_speed must be true or false, got {self.emulate_gpu_speed!r}")
        if self.emulate_gpu_speed and not self.time_scale > 0:
            raise RuntimeConfigError(f"emulate_gpu_speed scales the emulated compute, but time_scale "
                                     f"{self.time_scale!r} runs without emulation; give a time scale > 0")
        self.compute_scale()  # every device's gpu type must be known before launch
        if self.dp_hierarchical and any(parse_codec_spec(spec)[0] == "powersgd" for spec in (self.dp_codec, *self.dp_codecs)):
            raise RuntimeConfigError("--dp-hierarchical takes a codec of geotrain.codecs; powersgd is its own exchange")
        if self.dp_hierarchical and self.optimizer == "onebit-adam":
            raise RuntimeConfigError("--dp-hierarchical with onebit-adam: not supported in the runtime (1-bit Adam "
                                     "between regions is geotrain.optim.RegionOneBitAdam, for DDP scripts)")
        if self.sync_every is not None:
            self._check_outer()
        if self.resume and not self.checkpoint_dir:
            raise RuntimeConfigError("resume needs a checkpoint directory")
        if self.overwrite and not self.checkpoint_dir:
            raise RuntimeConfigError("overwrite needs a checkpoint directory")
        if self.resume and self.overwrite:
            raise RuntimeConfigError("resume and overwrite exclude each other")
        if self.model_name in MODEL_PRESETS and self.model.n_layer + 2 < self.pipeline_stages:
            raise RuntimeConfigError(f"model {self.model_name!r}: cannot cut {self.model.n_layer + 2} layers into "
                                     f"{self.pipeline_stages} stages ({self.stages} x {self.stages_per_rank} virtual)")

    def _check_outer(self) -> None:
        try:
            check_outer_settings(self.sync_every, self.outer_lr, self.outer_momentum, "RuntimeConfig")
        except OuterStepError as exc:
            raise RuntimeConfigError(str(exc)) from None
        if self.optimizer != "adamw":
            raise RuntimeConfigError(f"sync_every (local SGD) runs AdamW inside each replica; optimizer must be "
                                     f"adamw, got {self.optimizer!r}")
        if self.clip_grad_norm is not None:
            raise RuntimeConfigError(f"sync_every (local SGD): replicas do not exchange gradients, so the global "
                                     f"clip_grad_norm {self.clip_grad_norm!r} cannot be computed; leave it unset")

    def _check_choices(self) -> None:
        choices = [("schedule", self.schedule, PIPELINE_SCHEDULES), ("split", self.split, SPLIT_RULES),
                   ("device", self.device, DEVICES), ("precision", self.precision, PRECISIONS)]
        for name, value, allowed in choices:
            if value not in allowed:
                raise RuntimeConfigError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        if self.virtual_stages is not None:
            looped = self.schedule in LOOPED_SCHEDULES
            if not isinstance(self.virtual_stages, int) or self.virtual_stages < (2 if looped else 1) or (
                    not looped and self.virtual_stages != 1):
                allowed = "an integer >= 2" if looped else "1"
                raise RuntimeConfigError(f"virtual_stages must be {allowed} with schedule {self.schedule!r}, "
                                         f"got {self.virtual_stages!r}")
        if self.schedule in LOOPED_SCHEDULES and self.microbatches % self.stages:
            raise RuntimeConfigError(f"microbatches must be a multiple of the {self.stages} stages with schedule "
                                     f"{self.schedule!r}, got {self.microbatches}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeConfigError("device cuda: torch sees no CUDA device here (use --device cpu or auto)")
        if self.data is not None and not Path(self.data).exists():
            raise RuntimeConfigError(f"data {self.data!r}: no such file or directory")
        if self.device == "cuda" and self.time_scale > 0:
            raise RuntimeConfigError("device cuda: link emulation runs on CPU (gloo) only; pass --time-scale 0 "
                                     f"to train over NCCL without emulation, got time_scale {self.time_scale!r}")
        if not isinstance(self.val_fraction, float | int) or not 0.0 <= self.val_fraction < 1.0:
            raise RuntimeConfigError(f"val_fraction must be in [0, 1), got {self.val_fraction!r}")
        if self.eval_every and self.val_fraction == 0:
            raise RuntimeConfigError("eval_every needs a held-out split: val_fraction is 0")

    def _check_numbers(self) -> None:
        """Every numeric option: its type, finiteness and range (in this order, so that a bad value is
        named before any arithmetic uses it)."""
        integers = {"steps": 1, "microbatches": 1, "batch_size": 1, "seed": 0, "data_seed": 0, "threads": 1,
                    "checkpoint_every": 0, "onebit_warmup_steps": 1, "eval_every": 0, "eval_windows": 1}
        for name, low in integers.items():
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise RuntimeConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.stop_after is not None and (not isinstance(self.stop_after, (int, np.integer))
                                            or isinstance(self.stop_after, bool) or self.stop_after < 1):
            raise RuntimeConfigError(f"stop_after must be an integer >= 1, got {self.stop_after!r}")
        if self.seq_len is not None and (not isinstance(self.seq_len, (int, np.integer)) or isinstance(self.seq_len, bool)
                                         or self.seq_len < 1):
            raise RuntimeConfigError(f"seq_len must be an integer >= 1, got {self.seq_len!r}")
        if self.batch_size % self.microbatches:
            raise RuntimeConfigError(f"batch_size must be a positive multiple of microbatches ({self.microbatches}), "
                                     f"got {self.batch_size!r}")
        floats = [("lr", self.lr, False), ("time_scale", self.time_scale, True),
                  *([("clip_grad_norm", self.clip_grad_norm, False)] if self.clip_grad_norm is not None else []),
                  ("heartbeat_interval_s", self.heartbeat_interval_s, False),
                  ("heartbeat_timeout_s", self.heartbeat_timeout_s, False),
                  ("comm_timeout_s", self.comm_timeout_s, False)]
        for name, value, zero_ok in floats:
            number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
                raise RuntimeConfigError(f"{name} must be a finite number {'>= 0' if zero_ok else '> 0'}, "
                                         f"got {value!r}")
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise RuntimeConfigError(f"heartbeat_timeout_s must be more than twice heartbeat_interval_s "
                                     f"({self.heartbeat_interval_s!r}), got {self.heartbeat_timeout_s!r}")
        if self.comm_timeout_s < MIN_COMM_TIMEOUT_S:
            raise RuntimeConfigError(f"comm_timeout_s must be at least {MIN_COMM_TIMEOUT_S:g} s (workers need "
                                     f"that long to start and meet), got {self.comm_timeout_s!r}")

    def stage_dp_codec(self, stage: int) -> str:
        """The DP codec spec of `stage`'s group."""
        return self.dp_codecs[stage] if self.dp_codecs else self.dp_codec

    def cut_pp_codec(self, cut: int) -> str:
        """The activation codec spec of cut `cut` (between stage cut and cut + 1)."""
        return self.pp_codecs[cut] if self.pp_codecs else self.pp_codec

    def wire_dtypes(self) -> Any:
        """The activation dtype on the wire: one torch dtype (every cut alike), or one per pipeline cut."""
        if len(set(self.pp_codecs)) > 1:
            return [WIRE_DTYPES[parse_codec_spec(spec)[0]] for spec in self.pp_codecs]
        return WIRE_DTYPES[parse_codec_spec(self.cut_pp_codec(0))[0]]

    def for_stage(self, stage: int) -> RuntimeConfig:
        """This config with `stage`'s DP codec as the only one (what builds that stage's exchange)."""
        return self if not self.dp_codecs else replace(self, dp_codec=self.stage_dp_codec(stage), dp_codecs=())

    def split_weights(self) -> tuple[float, ...] | None:
        """Relative speed of each of the S x V pipeline stages for split_by_speed (virtual stage v runs on
        pp-rank v mod S): the stage's slowest replica's peak FLOP/s (cluster gpu types, cost/gpus.py) over
        the fastest stage's. None without split_by_speed or when every stage is alike (the plain split)."""
        if not self.split_by_speed:
            return None
        speeds = stage_speeds(self.assignment, self._peak_flops("split by speed"))
        if np.all(speeds == speeds[0]):
            return None
        relative = speeds / speeds.max()
        return tuple(float(relative[v % self.stages]) for v in range(self.pipeline_stages))

    def compute_scale(self) -> tuple[float, ...] | None:
        """With emulate_gpu_speed, one factor per cluster device: the cluster's fastest GPU's peak FLOP/s over
        the device's (cost/gpus.py), by which the emulator multiplies that device's measured compute (the
        fastest GPU computes at this machine's speed). None without emulate_gpu_speed."""
        if not self.emulate_gpu_speed:
            return None
        peaks = self._peak_flops("emulate GPU speed")
        return tuple(float(k) for k in peaks.max() / peaks)

    def _peak_flops(self, purpose: str) -> np.ndarray:
        """(N,) peak FLOP/s of the cluster's devices; an unknown gpu type is a one-line config error."""
        try:
            return device_peak_flops(self.cluster)
        except UnknownGpuError as exc:
            raise RuntimeConfigError(f"{purpose} on cluster {self.cluster.name!r}: {exc}") from None

    @cached_property
    def layout(self) -> Layout:
        return Layout(self.assignment)

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
        return self.batch_size // self.microbatches

    @property
    def stages_per_rank(self) -> int:
        """Virtual stages per rank (V)."""
        if self.virtual_stages is not None:
            return self.virtual_stages
        return 2 if self.schedule in LOOPED_SCHEDULES else 1

    @property
    def pipeline_stages(self) -> int:
        """Stages of one replica's pipeline: S x V."""
        return self.stages * self.stages_per_rank

    @property
    def sequence_length(self) -> int:
        """Tokens per training sequence: --seq-len, else a preset's context, else DEFAULT_SEQ_LEN."""
        if self.seq_len is not None:
            return int(self.seq_len)
        return self.model.context if self.model_name in MODEL_PRESETS else DEFAULT_SEQ_LEN

    @cached_property
    def data_identity(self) -> dict[str, Any]:
        """The data of the run (the world's seed, or every data file's size and sha256), hashed once."""
        return data_identity(self.data, self.data_seed, self.val_fraction)

    def model_identity(self) -> dict[str, Any]:
        """The model of the run: a preset's config, or the spec and the sha256 of the file it names."""
        if self.model_name in MODEL_PRESETS:
            return {"spec": self.model_name, **asdict(self.model)}
        target = self.model_name[3:] if self.model_name.startswith("hf:") else self.model_name.rpartition(":")[0]
        path = Path(target)
        file = path / "config.json" if path.is_dir() else path
        digest = hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else None
        return {"spec": self.model_name, "sha256": digest}

    def identity(self) -> dict[str, Any]:
        """What must match for a checkpoint to be resumed (the numerics; not the cluster or the
        device placement, which change timing only)."""
        per_link = {key: list(value) for key, value in (("dp_codecs", self.dp_codecs), ("pp_codecs", self.pp_codecs))
                    if value}
        return {"stages": self.stages, "replicas": self.replicas, "model": self.model_identity(),
                "data": self.data_identity,
                "steps": self.steps, "microbatches": self.microbatches, "batch_size": self.batch_size,
                "seq_len": self.sequence_length, "split": self.split, "virtual_stages": self.stages_per_rank,
                "precision": self.precision,
                "lr": self.lr, "schedule": self.schedule, "dp_codec": self.dp_codec, "pp_codec": self.pp_codec,
                "error_feedback": self.error_feedback, "seed": self.seed, "data_seed": self.data_seed,
                "optimizer": self.optimizer, "onebit_warmup_steps": self.onebit_warmup_steps,
                "clip_grad_norm": self.clip_grad_norm, **per_link,
                **({"split_by_speed": True} if self.split_by_speed else {}),
                **({"split_boundaries": list(self.split_boundaries)} if self.split_boundaries else {}),
                **({"dp_hierarchical": True} if self.dp_hierarchical else {}),
                **({"sync_every": self.sync_every, "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum}
                   if self.sync_every is not None else {})}

    def to_json(self) -> dict[str, Any]:
        return {**self.identity(), "model_name": self.model_name, "device": self.device, "cluster": self.cluster.name,
                "assignment": self.assignment.tolist(), "time_scale": self.time_scale, "plan": self.plan_name}


def plan_codec_fields(codecs: Any, dp_flag: str | None, pp_flag: str | None) -> dict[str, Any]:
    """RuntimeConfig codec fields from a plan's codec choice (geotrain.plan.PlanCodecs or None) and the
    --dp-codec / --pp-codec flags: a given flag overrides the plan for every stage / cut; without flag
    and choice, "none"."""
    fields: dict[str, Any] = {"dp_codec": dp_flag or "none", "pp_codec": pp_flag or "none"}
    if codecs is not None and dp_flag is None:
        fields["dp_codecs"] = tuple(codecs.dp)
    if codecs is not None and pp_flag is None:
        fields["pp_codecs"] = tuple(codecs.pp)
    return fields
