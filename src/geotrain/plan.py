"""Plan files: the JSON that `geotrain plan --json` prints and `geotrain cost --plan` / `geotrain train --plan` read.

    {"method": str, "stages": S, "replicas": R, "assignment": [[R ints] x S],
     "cost": {"dp": s, "pp": s, "total": s}, "seconds": wall seconds of the search, ...extra fields}

Only "stages", "replicas" and "assignment" are required when reading; other fields are kept as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from geotrain.cost.assignment import AssignmentError, as_assignment
from geotrain.errors import GeotrainError


class PlanError(GeotrainError, ValueError):
    """A plan file is unreadable or does not fit the cluster."""


@dataclass(frozen=True)
class Plan:
    """An assignment plus whatever the producer recorded (method, cost, seconds, lower bound...)."""

    stages: int
    replicas: int
    assignment: np.ndarray
    fields: dict[str, Any] = field(default_factory=dict)

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
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{source}: {key} must be an integer >= 1, got {value!r}")
    try:
        assignment = as_assignment(doc["assignment"], stages, replicas, n_devices=np.iinfo(np.int64).max)
    except AssignmentError as exc:
        raise PlanError(f"{source}: {exc}") from None
    fields = {k: v for k, v in doc.items() if k not in ("stages", "replicas", "assignment")}
    return Plan(stages=stages, replicas=replicas, assignment=assignment, fields=fields)


def load_plan(path: str | Path) -> Plan:
    """Read a plan file written by `geotrain plan --json` (or by hand)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise PlanError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"{path}: not valid JSON: {exc}") from None
    return plan_from_json(doc, str(path))


def save_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(json.dumps(plan.to_json(), indent=2) + "\n")
