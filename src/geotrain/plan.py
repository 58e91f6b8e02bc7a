"""Plan files: the JSON that `geotrain plan --json` prints and `geotrain cost --plan` / `geotrain train --plan` /
`geotrain emulate --plan` read, as one frozen `Plan` parsed once (`Plan.load(path)`, `Plan.from_json(doc)`)
and written back by `plan.to_json()`, key for key in the order it was read (so a plan round-trips byte
for byte).

    {"method": str, "stages": S, "replicas": R, "assignment": [[R ints] x S],
     "cost": {"dp": s, "pp": s, "total": s}, "seconds": wall seconds of the search, ...extra fields}

Only "stages", "replicas" and "assignment" are required when reading; "method" (a string), "cost" (an
object of seconds), "seconds" (a number) and "microbatches" (an integer >= 1, `plan` auto-configuration)
are typed when present; other fields (seed, cluster, job, cost_model, options, details, lower bound,
candidates...) are kept as they are in `Plan.extra`.
Which cluster and job a plan was made for (`geotrain plan` records them): "cluster" (its name) and
"cluster_fingerprint" (`Cluster.fingerprint()`: what placement depends on), "job" (its name) and "job_spec"
(the job's fields). `train --plan` and `cost --plan` refuse a plan whose fingerprint is another cluster's
(`Plan.check_cluster`; a plan with a cluster name but no fingerprint, from an older geotrain, is noted and
taken); `cost --plan` scores the recorded job (`Plan.recorded_job`).
An optional "codecs" object (`geotrain plan --codecs auto`) records the codec choice:
    {"version": 1, "policy": "dp=sign,pp=int8-block", "tolerance": 0.02,
     "dp": [S codec specs, one per stage's DP group], "pp": [S-1 codec specs, one per stage cut],
     "cost": {"dp", "pp", "total"} predicted with them, "uncompressed": {...} without}
Plans without it (older ones included) have no codec choice (`Plan.codecs` is None); "dp" and "pp" are
checked here for shape and type, the codec names by the runtime that applies them.
An optional "split" object (`geotrain plan --uneven-split`) records the layer split the cost was
predicted with: {"rule": "speed", "layers": L, "counts": [S ints], "boundaries": [0, b_1, ..., L],
"shares": [S fractions], "stage_tflops": [S], "cost_equal_split": {...}}; "boundaries" is checked here
(`Plan.split.boundaries`), and `geotrain train --plan` cuts the model there (runtime.stages.plan_cut).
An optional "shards" object (`geotrain plan --shards K`, sharded replicas: cost/shards.py) makes every (stage,
replica) slot K devices of one site holding FSDP2 shards of its stage:
    {"k": K, "devices": [[[K device indices] x R] x S], "gathers_per_step": 2, ...}
"assignment" keeps one device per slot, the slot's first (`devices[s][r][0]`), so a reader that knows nothing
of shards still sees the layout; "devices" names the rest. Plans without it (older ones included) have one
device per slot (`Plan.shards` is None, K = 1). Shape, types and the first devices are checked here; that a
slot's devices are one site's, distinct and used once, against the cluster (`Plan.check_shard_devices`).
Plan files are read by geotrain.yaml_text (JSON, or YAML under the same rules). Every assignment entry
must be an integer device index (true/false are refused, not read as 1/0) in 0..MAX_DEVICES-1 when read,
and below the cluster's device count when fitted to a cluster (Plan.check_fits).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from geotrain.cluster.model import MAX_DEVICES, Cluster
from geotrain.cost.assignment import AssignmentError, as_assignment
from geotrain.cost.shards import ShardError, check_shards, check_slots
from geotrain.errors import GeotrainError, shown
from geotrain.job import JOB_PRESETS, Job, JobError, job_from_dict, job_to_dict
from geotrain.yaml_text import document_errors_as, parse_document, read_text_file


class PlanError(GeotrainError, ValueError):
    """A plan file is unreadable or does not fit the cluster."""


CODECS_VERSION = 1
"""The newest "codecs" object version this geotrain reads."""


def _in_order(values: dict[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """`values` with the keys of `order` first, in that order (the order a file had), then the rest."""
    return {**{key: values[key] for key in order if key in values}, **values}


@dataclass(frozen=True)
class PlanCodecs:
    """A plan's codec choice: one DP codec spec per stage, one activation codec spec per stage cut.

    `extra`: the other keys of the "codecs" object (version, policy, tolerance, predicted costs), and
    `key_order` the object's key order as read: both kept for `to_json`, neither compared."""

    dp: tuple[str, ...]
    pp: tuple[str, ...]
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    key_order: tuple[str, ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, Any]:
        return _in_order({**self.extra, "dp": list(self.dp), "pp": list(self.pp)}, self.key_order)


@dataclass(frozen=True)
class PlanSplit:
    """A plan's layer split: cut points (0, b_1, ..., L) of S contiguous stages over the job's L layers.

    `extra`: the other keys of the "split" object (rule, counts, shares, stage_tflops, cost_equal_split),
    `key_order` the object's key order as read: both kept for `to_json`, neither compared."""

    boundaries: tuple[int, ...]
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    key_order: tuple[str, ...] = field(default=(), compare=False)

    @property
    def layer_shares(self) -> list[float]:
        """Each stage's fraction of the layers."""
        cuts = self.boundaries
        return [(b - a) / cuts[-1] for a, b in zip(cuts, cuts[1:])]

    def to_json(self) -> dict[str, Any]:
        return _in_order({**self.extra, "boundaries": list(self.boundaries)}, self.key_order)


@dataclass(frozen=True, eq=False)
class PlanShards:
    """A plan's sharded slots: `devices` (S, R, K) device indices, slot (s, r) being devices[s, r, :];
    `extra`: the other keys of the "shards" object, `key_order` its key order as read (kept for `to_json`)."""

    devices: np.ndarray
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    key_order: tuple[str, ...] = field(default=(), compare=False)

    @property
    def k(self) -> int:
        return int(self.devices.shape[-1])

    def to_json(self) -> dict[str, Any]:
        return _in_order({"k": self.k, **self.extra, "devices": np.asarray(self.devices).tolist()},
                         self.key_order or ("k", "devices"))


@dataclass(frozen=True, eq=False)
class Plan:
    """A placement plan: `assignment[s][r]` is the device of stage s in replica r, shape (stages, replicas).

    method: the search method that made it; cost: predicted seconds per iteration by term ("dp", "pp",
    "total", ...); seconds: wall seconds of the search; microbatches: the micro-batch count chosen with
    the layout (auto-configuration); codecs / split: the recorded codec choice and layer split. None:
    not recorded. `extra`: every other key, as read; `key_order`: the file's key order (to_json keeps it;
    empty: method, stages, replicas, microbatches, assignment, cost, seconds, extra..., split, codecs).
    """

    stages: int
    replicas: int
    assignment: np.ndarray
    method: str | None = None
    cost: Mapping[str, float] | None = None
    seconds: float | None = None
    microbatches: int | None = None
    codecs: PlanCodecs | None = None
    split: PlanSplit | None = None
    shards: PlanShards | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    key_order: tuple[str, ...] = ()

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read a plan file written by `geotrain plan --json` (or by hand, JSON or YAML)."""
        with document_errors_as(PlanError):
            text = read_text_file(path)
        return cls.from_text(text, str(path))

    @classmethod
    def from_text(cls, text: str, source: str = "<plan>") -> Plan:
        """Parse plan text (JSON, or YAML under geotrain.yaml_text's rules)."""
        with document_errors_as(PlanError):
            doc = parse_document(text, source)
        return cls.from_json(doc, source)

    @classmethod
    def from_json(cls, doc: Any, source: str = "<plan>") -> Plan:
        """Parse a plan document; checks structure and types, not the device range (see check_fits)."""
        if not isinstance(doc, dict):
            raise PlanError(f"{source}: top level must be a JSON object, got {type(doc).__name__}")
        stages, replicas, assignment = _layout(doc, source)
        known = ("stages", "replicas", "assignment", "method", "cost", "seconds", "microbatches", "codecs", "split",
                 "shards")
        return cls(stages=stages, replicas=replicas, assignment=assignment,
                   method=_optional(doc, "method", source, _string),
                   cost=_optional(doc, "cost", source, _seconds_by_term),
                   seconds=_optional(doc, "seconds", source, _number),
                   microbatches=_optional(doc, "microbatches", source, _count),
                   codecs=plan_codecs(doc.get("codecs"), stages, source),
                   split=plan_split(doc.get("split"), stages, source),
                   shards=plan_shards(doc.get("shards"), assignment, source),
                   extra={k: v for k, v in doc.items()
                          if k not in known or v is None and k in ("codecs", "split", "shards")},
                   key_order=tuple(doc))  # a null codecs / split (nothing recorded) is written back as read

    def to_json(self) -> dict[str, Any]:
        """The plan document (what `plan --json` prints and `plan --out` writes)."""
        typed = {"method": self.method, "stages": self.stages, "replicas": self.replicas,
                 "microbatches": self.microbatches, "assignment": np.asarray(self.assignment).tolist(),
                 "cost": None if self.cost is None else dict(self.cost), "seconds": self.seconds}
        values = {**{k: v for k, v in typed.items() if v is not None}, **self.extra}
        if self.split is not None:
            values["split"] = self.split.to_json()
        if self.codecs is not None:
            values["codecs"] = self.codecs.to_json()
        if self.shards is not None:
            values["shards"] = self.shards.to_json()
        return _in_order(values, self.key_order)

    @property
    def k(self) -> int:
        """Devices per (stage, replica) slot: the shards' K, 1 without shards."""
        return 1 if self.shards is None else self.shards.k

    def check_shard_devices(self, cluster: Cluster, source: str = "<plan>") -> np.ndarray:
        """(S, R, K) devices of every slot (K = 1 without shards), checked against `cluster`: in range, each
        slot in one site, no device used twice; PlanError names the source."""
        devices = (np.asarray(self.assignment)[..., None] if self.shards is None else self.shards.devices)
        try:
            check_slots(cluster, devices, f"{source}: shards.devices")
        except ShardError as exc:
            raise PlanError(str(exc)) from None
        return devices

    def check_fits(self, n_devices: int, source: str = "<plan>") -> np.ndarray:
        """The validated assignment for a cluster of `n_devices`; PlanError names the source."""
        try:
            assignment = as_assignment(self.assignment, self.stages, self.replicas, n_devices)
        except AssignmentError as exc:
            raise PlanError(f"{source}: {exc}") from None
        if self.shards is not None and int(self.shards.devices.max()) >= n_devices:
            raise PlanError(f"{source}: shards.devices names device {int(self.shards.devices.max())}, but the cluster "
                            f"has {n_devices} devices (0..{n_devices - 1})")
        return assignment


    def check_cluster(self, cluster: Cluster, source: str = "<plan>", cluster_source: str = "<cluster>") -> str | None:
        """PlanError when the plan was made for another cluster (its recorded fingerprint is not `cluster`'s),
        naming both; a note (one line) when it names a cluster but records no fingerprint (an older plan,
        taken unchecked); None when it fits or records no cluster (a hand-written plan)."""
        recorded = self.extra.get("cluster_fingerprint")
        name = self.extra.get("cluster")
        if recorded is None:
            if name is None:
                return None
            return (f"{source} records cluster {shown(name)} but no cluster fingerprint (a plan of an older "
                    f"geotrain): not checked against {cluster_source}")
        if recorded != cluster.fingerprint():
            raise PlanError(f"{source} is a plan for cluster {shown(name)} (fingerprint {recorded}), not for "
                            f"{cluster_source}: cluster {shown(cluster.name)} (fingerprint {cluster.fingerprint()}); "
                            f"plan again with --cluster {cluster_source}")
        return None

    def recorded_job(self, source: str = "<plan>") -> Job | None:
        """The job the plan was made for: its recorded fields ("job_spec"), else the preset its "job" names;
        None when it records neither."""
        spec = self.extra.get("job_spec")
        if spec is not None:
            try:
                return job_from_dict(spec, f"{source}: job_spec")
            except JobError as exc:
                raise PlanError(str(exc)) from None
        name = self.extra.get("job")
        return JOB_PRESETS.get(name) if isinstance(name, str) else None


def cluster_record(cluster: Cluster) -> dict[str, str]:
    """What a plan records of the cluster it was made for: its name and fingerprint."""
    return {"cluster": cluster.name, "cluster_fingerprint": cluster.fingerprint()}


def job_record(job: Job) -> dict[str, Any]:
    """What a plan records of the job it was made for: its name and fields."""
    return {"job": job.name, "job_spec": job_to_dict(job)}


def _layout(doc: dict[str, Any], source: str) -> tuple[int, int, np.ndarray]:
    """(stages, replicas, assignment) of a plan document, each entry a device index in 0..MAX_DEVICES-1."""
    for key in ("stages", "replicas", "assignment"):
        if key not in doc:
            raise PlanError(f"{source}: missing key {key!r}")
    stages, replicas = doc["stages"], doc["replicas"]
    for key, value in (("stages", stages), ("replicas", replicas)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEVICES:
            raise PlanError(f"{source}: {key} must be an integer in 1..{MAX_DEVICES}, got {shown(value)}")
    if stages * replicas > MAX_DEVICES:
        raise PlanError(f"{source}: {stages} stages x {replicas} replicas exceed the device limit of {MAX_DEVICES}")
    rows = doc["assignment"]
    if not isinstance(rows, list) or len(rows) != stages:
        raise PlanError(f"{source}: assignment must have shape ({stages} stages, {replicas} replicas): "
                        f"a list of {stages} rows, got {shown(rows)}")
    for s, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != replicas:
            raise PlanError(f"{source}: assignment[{s}] must be a list of {replicas} device indices "
                            f"(shape ({stages} stages, {replicas} replicas)), got {shown(row)}")
        for r, value in enumerate(row):
            _check_device_index(value, f"{source}: assignment[{s}][{r}]")
    try:
        return stages, replicas, as_assignment(np.array(rows, dtype=np.int64), stages, replicas, n_devices=MAX_DEVICES)
    except AssignmentError as exc:
        raise PlanError(f"{source}: {exc}") from None


def _optional(doc: dict[str, Any], key: str, source: str, parse: Callable[[Any, str], Any]) -> Any:
    """`parse(value, where)` of doc[key], or None when the key is absent."""
    return parse(doc[key], f"{source}: {key}") if key in doc else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise PlanError(f"{where} must be a string, got {shown(value)}")
    return value


def _number(value: Any, where: str) -> float:
    if not _is_number(value):
        raise PlanError(f"{where} must be a number of seconds, got {shown(value)}")
    return value


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{where} must be an integer >= 1, got {shown(value)}")
    return value


def _seconds_by_term(value: Any, where: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise PlanError(f"{where} must be an object of seconds by term (dp, pp, total...), got {shown(value)}")
    for term, seconds in value.items():
        _number(seconds, f"{where}.{term}")
    return dict(value)


def plan_codecs(doc: Any, stages: int, source: str = "<plan>") -> PlanCodecs | None:
    """The "codecs" object of a plan with `stages` stages (None if absent); PlanError names the key."""
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise PlanError(f"{source}: codecs must be an object, got {shown(doc)}")
    version = doc.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= CODECS_VERSION:
        raise PlanError(f"{source}: codecs.version must be an integer in 1..{CODECS_VERSION} "
                        f"(a newer geotrain wrote this plan?), got {shown(version)}")
    lists = {}
    for key, length, what in (("dp", stages, "stage"), ("pp", stages - 1, "stage cut")):
        value = doc.get(key)
        if not isinstance(value, list) or len(value) != length:
            raise PlanError(f"{source}: codecs.{key} must be a list of {length} codec specs (one per {what}), "
                            f"got {shown(value)}")
        for i, spec in enumerate(value):
            if not isinstance(spec, str) or not spec.strip():
                raise PlanError(f"{source}: codecs.{key}[{i}] must be a codec spec string, got {shown(spec)}")
        lists[key] = tuple(value)
    extra = {k: v for k, v in doc.items() if k not in ("dp", "pp")}
    return PlanCodecs(dp=lists["dp"], pp=lists["pp"], extra=extra, key_order=tuple(doc))


def plan_split(doc: Any, stages: int, source: str = "<plan>") -> PlanSplit | None:
    """The "split" object of a plan (None if absent); PlanError names the key."""
    if doc is None:
        return None
    cuts = doc.get("boundaries") if isinstance(doc, dict) else None
    if not isinstance(cuts, list) or len(cuts) != stages + 1 or any(
            isinstance(b, bool) or not isinstance(b, int) for b in cuts) or cuts[0] != 0 or any(
            b <= a for a, b in zip(cuts, cuts[1:])):
        raise PlanError(f"{source}: split.boundaries must be {stages + 1} increasing integers from 0 "
                        f"(one stage per pair), got {shown(cuts)}")
    return PlanSplit(boundaries=tuple(cuts), extra={k: v for k, v in doc.items() if k != "boundaries"},
                     key_order=tuple(doc))


def plan_shards(doc: Any, assignment: np.ndarray, source: str = "<plan>") -> PlanShards | None:
    """The "shards" object of a plan whose assignment is `assignment` (S, R) (None if absent); PlanError names the
    key. `devices[s][r]` must list K device indices starting with `assignment[s][r]`."""
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise PlanError(f"{source}: shards must be an object {{\"k\": K, \"devices\": [...]}}, got {shown(doc)}")
    try:
        k = check_shards(doc.get("k"), f"{source}: shards.k")
    except ShardError as exc:
        raise PlanError(str(exc)) from None
    stages, replicas = assignment.shape
    rows = doc.get("devices")
    shape = f"({stages} stages, {replicas} replicas, {k} devices)"
    if not isinstance(rows, list) or len(rows) != stages or any(
            not isinstance(row, list) or len(row) != replicas or any(
                not isinstance(slot, list) or len(slot) != k for slot in row) for row in rows):
        raise PlanError(f"{source}: shards.devices must have shape {shape}: per stage, per replica, the slot's "
                        f"{k} devices, got {shown(rows)}")
    for s, row in enumerate(rows):
        for r, slot in enumerate(row):
            for i, value in enumerate(slot):
                _check_device_index(value, f"{source}: shards.devices[{s}][{r}][{i}]")
            if int(slot[0]) != int(assignment[s, r]):
                raise PlanError(f"{source}: shards.devices[{s}][{r}] must start with the slot's device in the "
                                f"assignment ({int(assignment[s, r])}), got {shown(slot)}")
    devices = np.array(rows, dtype=np.int64)
    flat = devices.ravel()
    if len(set(flat.tolist())) != flat.size:
        twice = next(d for d in flat.tolist() if (flat == d).sum() > 1)
        raise PlanError(f"{source}: shards.devices uses device {twice} more than once (each device holds one shard)")
    devices.setflags(write=False)
    return PlanShards(devices=devices, extra={key: v for key, v in doc.items() if key not in ("k", "devices")},
                      key_order=tuple(doc))


def _check_device_index(value: Any, where: str) -> None:
    """A device index: an int (or an integral float) in 0..MAX_DEVICES-1; booleans are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"{where}: must be a device index (an integer), got {shown(value)}")
    if isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
        raise PlanError(f"{where}: must be a device index (an integer), got {shown(value)}")
    if not 0 <= value < MAX_DEVICES:
        raise PlanError(f"{where}: device index must be in 0..{MAX_DEVICES - 1}, got {shown(value)}")
