"""What a training run is: the plan on a cluster, the model, the schedule, the codecs, the knobs.

One frozen `RuntimeConfig` travels to every worker (pickled by the launcher, or rebuilt from the same
command line by every torchrun worker). Validated here, trusted inside the workers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from geotrain.cluster import Cluster
from geotrain.codecs import CodecError, get_codec, parse_codec_spec
from geotrain.cost import AssignmentError, as_assignment
from geotrain.ddp.powersgd import PowerSGDConfig
from geotrain.errors import GeotrainError
from geotrain.models import BASE_CONFIG, GPTConfig
from geotrain.runtime.layout import Layout, layer_ranges
from geotrain.runtime.pipeline import SCHEDULES


class RuntimeConfigError(GeotrainError, ValueError):
    """An invalid training option (named with its value and the allowed range)."""


MIN_COMM_TIMEOUT_S = 1.0
"""Shortest accepted gloo timeout (seconds): the rendezvous of freshly started workers takes a few."""

TINY_GPT = GPTConfig(n_layer=4)
"""The runtime's default model: 4 blocks (so up to 4 stages), d_model 128, context 96, 44 characters,
816,896 parameters (the demo's BASE_CONFIG with two more blocks)."""

MODEL_PRESETS: dict[str, GPTConfig] = {
    "tiny": TINY_GPT,
    "tiny-2layer": BASE_CONFIG,  # the compression demo's model: at most 2 stages
}

PP_CODECS = ("none", "fp16", "bf16", "int8-block")
"""Codecs allowed for pipeline activations (dense, shape-preserving, cheap)."""


@dataclass(frozen=True, eq=False)
class RuntimeConfig:
    """A run. Times in seconds; `time_scale` multiplies every emulated link time (0: no emulation).

    `batch_size` is sequences per replica per iteration (global batch = batch_size x replicas), cut
    into `microbatches` equal micro-batches. `stop_after` ends this invocation after that many steps
    (a planned interruption) while the learning-rate schedule still spans `steps`.
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
    extra: dict[str, Any] = field(default_factory=dict)

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
        if self.schedule not in SCHEDULES:
            raise RuntimeConfigError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if parse_codec_spec(self.pp_codec)[0] not in PP_CODECS:
            raise RuntimeConfigError(f"pipeline codec must be one of {', '.join(PP_CODECS)}, got {self.pp_codec!r}")
        for label, spec in (("gradient", self.dp_codec), ("pipeline", self.pp_codec)):
            try:
                name, params = parse_codec_spec(spec)
                if label == "gradient" and name == "powersgd":  # distributed PowerSGD: its own knobs
                    PowerSGDConfig(**params)
                else:
                    get_codec(name, **params)
            except (CodecError, TypeError) as exc:
                raise RuntimeConfigError(f"{label} codec {spec!r}: {exc}") from None
        if self.dp_hierarchical and parse_codec_spec(self.dp_codec)[0] == "powersgd":
            raise RuntimeConfigError("--dp-hierarchical takes a codec of geotrain.codecs; powersgd is its own exchange")
        if self.resume and not self.checkpoint_dir:
            raise RuntimeConfigError("resume needs a checkpoint directory")
        if self.overwrite and not self.checkpoint_dir:
            raise RuntimeConfigError("overwrite needs a checkpoint directory")
        if self.resume and self.overwrite:
            raise RuntimeConfigError("resume and overwrite exclude each other")
        try:
            layer_ranges(self.model.n_layer, self.stages)
        except GeotrainError as exc:
            raise RuntimeConfigError(f"model {self.model_name!r}: {exc}") from None

    def _check_numbers(self) -> None:
        """Every numeric option: its type, finiteness and range (in this order, so that a bad value is
        named before any arithmetic uses it)."""
        integers = {"steps": 1, "microbatches": 1, "batch_size": 1, "seed": 0, "data_seed": 0, "threads": 1,
                    "checkpoint_every": 0}
        for name, low in integers.items():
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise RuntimeConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.stop_after is not None and (not isinstance(self.stop_after, (int, np.integer))
                                            or isinstance(self.stop_after, bool) or self.stop_after < 1):
            raise RuntimeConfigError(f"stop_after must be an integer >= 1, got {self.stop_after!r}")
        if self.batch_size % self.microbatches:
            raise RuntimeConfigError(f"batch_size must be a positive multiple of microbatches ({self.microbatches}), "
                                     f"got {self.batch_size!r}")
        floats = [("lr", self.lr, False), ("time_scale", self.time_scale, True),
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

    def identity(self) -> dict[str, Any]:
        """What must match for a checkpoint to be resumed (the numerics; not the cluster or the
        device placement, which change timing only)."""
        return {"stages": self.stages, "replicas": self.replicas, "model": asdict(self.model),
                "steps": self.steps, "microbatches": self.microbatches, "batch_size": self.batch_size,
                "lr": self.lr, "schedule": self.schedule, "dp_codec": self.dp_codec, "pp_codec": self.pp_codec,
                "error_feedback": self.error_feedback, "seed": self.seed, "data_seed": self.data_seed,
                **({"dp_hierarchical": True} if self.dp_hierarchical else {})}

    def to_json(self) -> dict[str, Any]:
        return {**self.identity(), "model_name": self.model_name, "cluster": self.cluster.name,
                "assignment": self.assignment.tolist(), "time_scale": self.time_scale, "plan": self.plan_name}
