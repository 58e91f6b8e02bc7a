"""Assignments: `assignment[s][r]` = device index of stage s, replica r; each device at most once."""

from __future__ import annotations

from typing import Any

import numpy as np

from geotrain.errors import GeotrainError


class AssignmentError(GeotrainError, ValueError):
    """An assignment has the wrong shape, an out-of-range device or a device used twice."""


def as_assignment(value: Any, stages: int, replicas: int, n_devices: int) -> np.ndarray:
    """Validate and return an (S, R) int64 array."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise AssignmentError(f"assignment is not a rectangular array of device indices: {exc}") from None
    if array.shape != (stages, replicas):
        raise AssignmentError(f"assignment must have shape ({stages} stages, {replicas} replicas), got {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        if not (np.issubdtype(array.dtype, np.floating) and np.all(array == np.round(array))):
            raise AssignmentError(f"assignment entries must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64)
    bad = np.argwhere((array < 0) | (array >= n_devices))
    if len(bad):
        s, r = bad[0]
        raise AssignmentError(f"assignment[{s}][{r}] = {array[s, r]}: device index must be in 0..{n_devices - 1}")
    values, counts = np.unique(array, return_counts=True)
    if np.any(counts > 1):
        device = int(values[counts > 1][0])
        where = [tuple(map(int, p)) for p in np.argwhere(array == device)]
        raise AssignmentError(f"device {device} is used more than once, at (stage, replica) {where}")
    return array


def assignment_from_order(order: Any, stages: int, replicas: int) -> np.ndarray:
    """The seed's convention: position k of a device permutation is (stage k // R, replica k % R)."""
    order = np.asarray(order, dtype=np.int64)
    return order[: stages * replicas].reshape(stages, replicas)
