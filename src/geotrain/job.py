"""The training job: model size and batch shape, from which the bytes each iteration moves are derived.

Sizes in bytes (1 GB = 1e9 B). `dp_bytes` is c_dp of DESIGN.md (gradient of one stage),
`pp_bytes` is c_pp (activations of one replica at one stage cut per iteration).

Validation: `name` a non-empty string; `params` a number; the other fields integers (an integral
float such as 2e3 is read as 2000, a fractional one is refused); every field > 0 and at most
JOB_LIMITS[field], so that every derived byte count and cost stays finite. `pp_bytes(R)` refuses
R > global_batch (a replica would get no sample and the pipeline would carry 0 bytes).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from geotrain.errors import GeotrainError, shown
from geotrain.model_shapes import MODEL_SHAPES
from geotrain.yaml_text import document_errors_as, parse_document, read_text_file


class JobError(GeotrainError, ValueError):
    """A job description or a (stages, replicas) layout is invalid."""


# Upper bounds per field: generous for real models (1e15 parameters, 16M-token sequences), small
# enough that seq x hidden x bytes x batch and 6 x params x tokens stay far inside float64.
JOB_LIMITS: dict[str, float] = {
    "params": 1e15, "seq_len": 2**24, "hidden": 2**20, "global_batch": 2**40, "layers": 2**16, "bytes_per_value": 16,
    "vocab": 2**24,
}
_INTEGER_FIELDS = ("seq_len", "hidden", "global_batch", "layers", "bytes_per_value", "vocab")


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
        if not isinstance(self.name, str) or not self.name.strip():
            raise JobError(f"job name must be a non-empty string, got {shown(self.name)}")
        for key, limit in JOB_LIMITS.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or value <= 0:
                raise JobError(f"job {shown(self.name)}: {key} must be a number > 0, got {shown(value)}")
            if value > limit:
                raise JobError(f"job {shown(self.name)}: {key} must be at most {limit:g}, got {shown(value)}")
            if key in _INTEGER_FIELDS:
                if value != int(value):
                    raise JobError(f"job {shown(self.name)}: {key} must be an integer, got {shown(value)}")
                object.__setattr__(self, key, int(value))

    def dp_bytes(self, stages: int) -> float:
        """c_dp: gradient bytes of one pipeline stage (params split evenly over `stages`)."""
        return self.params * self.bytes_per_value / stages

    def pp_bytes(self, replicas: int) -> float:
        """c_pp: activation bytes one replica sends across one stage cut per iteration
        (seq x hidden x bytes x per-replica batch, batch = global_batch // replicas as in the seed).
        Raises JobError when replicas > global_batch (a replica would get no sample)."""
        self.check_every_replica_has_a_sample(replicas)
        return float(self.seq_len * self.hidden * self.bytes_per_value * (self.global_batch // replicas))

    def check_every_replica_has_a_sample(self, replicas: int) -> None:
        """JobError when replicas > global_batch: a replica would get no sample (nothing to score)."""
        if replicas > self.global_batch:
            raise JobError(f"job {shown(self.name)}: global_batch {self.global_batch} is smaller than the "
                           f"{replicas} replicas (each replica needs at least one sample per iteration)")

    def check_layout_fits(self, stages: int, replicas: int) -> None:
        """JobError unless the job splits evenly over the layout: every replica the same whole number
        of samples (global_batch a multiple of `replicas`; 12 on 8 would silently train on 8) and
        every stage at least one layer (layers >= `stages`)."""
        self.check_every_replica_has_a_sample(replicas)
        if self.global_batch % replicas:
            below = self.global_batch - self.global_batch % replicas
            raise JobError(f"job {shown(self.name)}: global_batch {self.global_batch} is not a multiple of the "
                           f"{replicas} replicas (each would get {self.global_batch // replicas} samples and "
                           f"{self.global_batch % replicas} would be dropped); use {below} or {below + replicas}")
        if self.layers < stages:
            raise JobError(f"job {shown(self.name)}: {self.layers} layers cannot fill {stages} pipeline stages "
                           f"(each stage needs at least one layer); use at most {self.layers} stages")

    def flops_per_iteration(self) -> float:
        """Training FLOPs per iteration: 6 x params x tokens."""
        return 6.0 * self.params * self.seq_len * self.global_batch

    def compute_seconds(self, devices: int, peak_flops: float = 125e12, utilisation: float = 0.4) -> float:
        """Seconds of compute per iteration spread over `devices` GPUs at `utilisation` of `peak_flops`
        (seed: 32 V100s, 125 TFLOP/s fp16 peak, 40% -> 10.2 s for the seed job)."""
        return self.flops_per_iteration() / (devices * peak_flops * utilisation)


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range
        return False


def check_layout(stages: int, replicas: int, n_devices: int) -> None:
    """Raise JobError unless stages, replicas >= 1 and stages x replicas <= n_devices."""
    for label, value in (("stages", stages), ("replicas", replicas)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise JobError(f"{label} must be an integer >= 1, got {shown(value)}")
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
    unknown = sorted(map(str, set(doc) - _JOB_KEYS))
    if unknown:
        raise JobError(f"{source}: unknown key {shown(unknown[0])} (allowed: {', '.join(sorted(_JOB_KEYS))})")
    doc = dict(doc)
    model = doc.pop("model", None)
    if model is not None and (not isinstance(model, str) or model not in MODEL_SHAPES):
        raise JobError(f"{source}: model: unknown model shape {shown(model)} (known: {', '.join(MODEL_SHAPES)})")
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
        raise JobError(f"{shown(str(spec))[1:-1]}: neither a job preset ({', '.join(sorted(JOB_PRESETS))}) "
                       f"nor an existing file")
    with document_errors_as(JobError):
        text = read_text_file(path)
    return parse_job_text(text, str(path))


def parse_job_text(text: str, source: str = "<job>") -> Job:
    """Parse YAML or JSON job text (geotrain.yaml_text's rules) into a Job."""
    with document_errors_as(JobError):
        doc = parse_document(text, source)
    return job_from_dict(doc, source)
