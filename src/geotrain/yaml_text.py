"""Reading YAML/JSON text the way users expect: exponent floats like 1e3 or 1.3e9 are numbers.

PyYAML follows YAML 1.1, where `1.3e9` (no dot before the exponent sign) is a string; JSON and
YAML 1.2 read it as a float. Cluster and job files both go through `load_yaml_text`.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    """SafeLoader that also resolves exponent floats without a dot or exponent sign."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml_text(text: str) -> Any:
    """Parse YAML or JSON text (JSON is YAML); raises yaml.YAMLError on bad syntax."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
