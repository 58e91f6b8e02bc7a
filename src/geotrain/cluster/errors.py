"""Errors raised while building or loading a cluster."""

from __future__ import annotations

from geotrain.errors import GeotrainError


class ClusterError(GeotrainError, ValueError):
    """A cluster description is invalid."""


class ClusterFileError(ClusterError):
    """A cluster file is invalid: names the file, the key path and the offending value."""

    def __init__(self, source: str, key_path: str, problem: str) -> None:
        self.source = source
        self.key_path = key_path
        self.problem = problem
        super().__init__(f"{source}: {key_path}: {problem}" if key_path else f"{source}: {problem}")
