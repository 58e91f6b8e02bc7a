"""The training job: model size and batch shape, from which the bytes each iteration moves are derived.

Sizes in bytes (1 GB = 1e9 B). `dp_bytes` is c_dp of DESIGN.md (gradient of one stage),
`pp_bytes` is c_pp (activations of one replica at one stage cut per iteration).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from geotrain.errors import GeotrainError
from geotrain.model_shapes import MODEL_SHAPES
from geotrain.yaml_text import load_yaml_text


class JobError(GeotrainError, ValueError):
    """A job description or a (stages, replicas) layout is invalid."""


@dataclass(frozen=True)
class Job:
    """A transformer training job. `params` in parameters; `bytes_per_value` of gradients and activations."""

    name: str
    params: float
    seq_len: int
    hidden: int
    global_batch: int
    layers: int = 24
    bytes_per_value: int = 2
    vocab: int = 50257

    def __post_init__(self) -> None:
        for key in ("params", "seq_len", "hidden", "global_batch", "layers", "bytes_per_value", "vocab"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise JobError(f"job {self.name!r}: {key} must be a number > 0, got {value!r}")

    def dp_bytes(self, stages: int) -> float:
        """c_dp: gradient bytes of one pipeline stage (params split evenly over `stages`)."""
        return self.params * self.bytes_per_value / stages

    def pp_bytes(self, replicas: int) -> float:
        """c_pp: activation bytes one replica sends across one stage cut per iteration
        (seq x hidden x bytes x per-replica batch, batch = global_batch // replicas as in the seed)."""
        return float(self.seq_len * self.hidden * self.bytes_per_value * (self.global_batch // replicas))

    def flops_per_iteration(self) -> float:
        """Training FLOPs per iteration: 6 x params x tokens."""
        return 6.0 * self.params * self.seq_len * self.global_batch

    def compute_seconds(self, devices: int, peak_flops: float = 125e12, utilisation: float = 0.4) -> float:
        """Seconds of compute per iteration spread over `devices` GPUs at `utilisation` of `peak_flops`
        (seed: 32 V100s, 125 TFLOP/s fp16 peak, 40% -> 10.2 s for the seed job)."""
        return self.flops_per_iteration() / (devices * peak_flops * utilisation)


def check_layout(stages: int, replicas: int, n_devices: int) -> None:
    """Raise JobError unless stages, replicas >= 1 and stages x replicas <= n_devices."""
    for label, value in (("stages", stages), ("replicas", replicas)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise JobError(f"{label} must be an integer >= 1, got {value!r}")
    if stages * replicas > n_devices:
        raise JobError(
            f"layout {stages} stages x {replicas} replicas needs {stages * replicas} devices, "
            f"the cluster has {n_devices}"
        )


GPT_13B_SEED = Job(name="gpt-1.3b-seed", params=1.3e9, seq_len=2048, hidden=2048, global_batch=1024, layers=24)

JOB_PRESETS: dict[str, Job] = {GPT_13B_SEED.name: GPT_13B_SEED,
                               **{name: Job(name=name, **shape.job_fields()) for name, shape in MODEL_SHAPES.items()}}

_JOB_KEYS = {"name", "params", "seq_len", "hidden", "global_batch", "layers", "bytes_per_value", "vocab", "model"}


def job_from_dict(doc: Any, source: str = "<job>") -> Job:
    """Build a Job from a mapping; unknown or missing keys name the source."""
    if not isinstance(doc, dict):
        raise JobError(f"{source}: top level must be a mapping, got {type(doc).__name__}")
    unknown = sorted(set(doc) - _JOB_KEYS)
    if unknown:
        raise JobError(f"{source}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_JOB_KEYS))})")
    doc = dict(doc)
    model = doc.pop("model", None)
    if model is not None and model not in MODEL_SHAPES:
        raise JobError(f"{source}: model: unknown model shape {str(model)[:60]!r} (known: {', '.join(MODEL_SHAPES)})")
    shape = MODEL_SHAPES[model].job_fields() if model is not None else {}
    missing = sorted({"params", "seq_len", "hidden", "global_batch"} - set(doc) - set(shape))
    if missing:
        raise JobError(f"{source}: missing key {missing[0]!r}")
    fields = {"name": Path(source).stem, **shape, **doc}
    try:
        return Job(**fields)
    except JobError as exc:
        raise JobError(f"{source}: {exc}") from None


def job_to_dict(job: Job) -> dict:
    return asdict(job)


def load_job(spec: str | Path) -> Job:
    """A job preset name, or the path of a YAML/JSON job file."""
    if isinstance(spec, str) and spec in JOB_PRESETS:
        return JOB_PRESETS[spec]
    path = Path(spec)
    if not path.exists():
        raise JobError(f"{spec}: neither a job preset ({', '.join(sorted(JOB_PRESETS))}) nor an existing file")
    try:
        doc = load_yaml_text(path.read_text())
    except yaml.YAMLError as exc:
        raise JobError(f"{path}: not valid YAML/JSON: {exc}") from None
    return job_from_dict(doc, str(path))
