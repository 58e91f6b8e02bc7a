"""Errors raised while building or loading a cluster."""

from __future__ import annotations

from geotrain.errors import GeotrainError


class ClusterError(GeotrainError, ValueError):
    """A cluster description is invalid."""


class ClusterFileError(ClusterError):
    """A cluster file is invalid: one line naming the file, the key path and the offending value
    (geotrain.yaml_text.located)."""
