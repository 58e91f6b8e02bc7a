"""Plan files: the JSON that `geotrain plan --json` prints and `geotrain cost --plan` / `geotrain train --plan` read.

    {"method": str, "stages": S, "replicas": R, "assignment": [[R ints] x S],
     "cost": {"dp": s, "pp": s, "total": s}, "seconds": wall seconds of the search, ...extra fields}

Only "stages", "replicas" and "assignment" are required when reading; other fields are kept as they are.
An optional "codecs" object (`geotrain plan --codecs auto`) records the codec choice:
    {"version": 1, "policy": "dp=sign,pp=int8-block", "tolerance": 0.02,
     "dp": [S codec specs, one per stage's DP group], "pp": [S-1 codec specs, one per stage cut],
     "cost": {"dp", "pp", "total"} predicted with them, "uncompressed": {...} without}
Plans without it (older ones included) have no codec choice (`Plan.codecs` is None); "dp" and "pp" are
checked here for shape and type, the codec names by the runtime that applies them.
An optional "split" object (`geotrain plan --uneven-split`) records the layer split the cost was
predicted with: {"rule": "speed", "layers": L, "counts": [S ints], "boundaries": [0, b_1, ..., L],
"shares": [S fractions], "stage_tflops": [S], "cost_equal_split": {...}}; "boundaries" is checked here
(`Plan.split`), and `geotrain train --plan` cuts the model there (runtime.stages.plan_cut).
Plan files are read by geotrain.yaml_text (JSON, or YAML under the same rules). Every assignment entry
must be an integer device index (true/false are refused, not read as 1/0) in 0..MAX_DEVICES-1 when read,
and below the cluster's device count when fitted to a cluster (Plan.check_fits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from geotrain.cluster.model import MAX_DEVICES
from geotrain.cost.assignment import AssignmentError, as_assignment
from geotrain.errors import GeotrainError, shown
from geotrain.yaml_text import DocumentError, parse_document, read_text_file


class PlanError(GeotrainError, ValueError):
    """A plan file is unreadable or does not fit the cluster."""


CODECS_VERSION = 1
"""The newest "codecs" object version this geotrain reads."""


@dataclass(frozen=True)
class PlanCodecs:
    """A plan's codec choice: one DP codec spec per stage, one activation codec spec per stage cut."""

    dp: tuple[str, ...]
    pp: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """An assignment plus whatever the producer recorded (method, cost, seconds, lower bound...)."""

    stages: int
    replicas: int
    assignment: np.ndarray
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def split(self) -> tuple[int, ...] | None:
        """The recorded layer split's cut points (0, b_1, ..., L), or None (no "split" object)."""
        return plan_split(self.fields.get("split"), self.stages)

    @property
    def codecs(self) -> PlanCodecs | None:
        """The recorded codec choice, or None (plans without a "codecs" object)."""
        return plan_codecs(self.fields.get("codecs"), self.stages)

    def to_json(self) -> dict[str, Any]:
        return {**self.fields, "stages": self.stages, "replicas": self.replicas, "assignment": self.assignment.tolist()}

    def check_fits(self, n_devices: int, source: str = "<plan>") -> np.ndarray:
        """The validated assignment for a cluster of `n_devices`; PlanError names the source."""
        try:
            return as_assignment(self.assignment, self.stages, self.replicas, n_devices)
        except AssignmentError as exc:
            raise PlanError(f"{source}: {exc}") from None


def plan_from_json(doc: Any, source: str = "<plan>") -> Plan:
    """Parse a plan document; checks structure, not the device range (see Plan.check_fits)."""
    if not isinstance(doc, dict):
        raise PlanError(f"{source}: top level must be a JSON object, got {type(doc).__name__}")
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
        assignment = as_assignment(np.array(rows, dtype=np.int64), stages, replicas, n_devices=MAX_DEVICES)
    except AssignmentError as exc:
        raise PlanError(f"{source}: {exc}") from None
    fields = {k: v for k, v in doc.items() if k not in ("stages", "replicas", "assignment")}
    plan_codecs(fields.get("codecs"), stages, source)
    plan_split(fields.get("split"), stages, source)
    return Plan(stages=stages, replicas=replicas, assignment=assignment, fields=fields)


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
    return PlanCodecs(dp=lists["dp"], pp=lists["pp"])


def plan_split(doc: Any, stages: int, source: str = "<plan>") -> tuple[int, ...] | None:
    """The cut points of a plan's "split" object (None if absent); PlanError names the key."""
    if doc is None:
        return None
    cuts = doc.get("boundaries") if isinstance(doc, dict) else None
    if not isinstance(cuts, list) or len(cuts) != stages + 1 or any(
            isinstance(b, bool) or not isinstance(b, int) for b in cuts) or cuts[0] != 0 or any(
            b <= a for a, b in zip(cuts, cuts[1:])):
        raise PlanError(f"{source}: split.boundaries must be {stages + 1} increasing integers from 0 "
                        f"(one stage per pair), got {shown(cuts)}")
    return tuple(cuts)


def _check_device_index(value: Any, where: str) -> None:
    """A device index: an int (or an integral float) in 0..MAX_DEVICES-1; booleans are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"{where}: must be a device index (an integer), got {shown(value)}")
    if isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
        raise PlanError(f"{where}: must be a device index (an integer), got {shown(value)}")
    if not 0 <= value < MAX_DEVICES:
        raise PlanError(f"{where}: device index must be in 0..{MAX_DEVICES - 1}, got {shown(value)}")


def load_plan(path: str | Path) -> Plan:
    """Read a plan file written by `geotrain plan --json` (or by hand, JSON or YAML)."""
    try:
        text = read_text_file(path)
    except DocumentError as exc:
        raise PlanError(str(exc)) from None
    return parse_plan_text(text, str(path))


def parse_plan_text(text: str, source: str = "<plan>") -> Plan:
    """Parse plan text (JSON, or YAML under geotrain.yaml_text's rules) into a Plan."""
    try:
        doc = parse_document(text, source)
    except DocumentError as exc:
        raise PlanError(str(exc)) from None
    return plan_from_json(doc, source)

