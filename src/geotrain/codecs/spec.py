"""Codec specs as written on command lines: `"topk"`, `"topk:fraction=0.01,value_dtype=fp16"`.

    name, params = parse_codec_spec("randk:fraction=0.1,allow_nonfinite=no")
    codec = get_codec(name, **params)       # ('randk', {'fraction': 0.1, 'allow_nonfinite': False})

The one parser of codec specs. Values read as JSON where they parse (numbers, strings in quotes),
else as the stripped text. Flags are parsed strictly: true/false, yes/no, 1/0 (any case) give a
bool for every parameter whose default is a bool, and any other value is refused (`bool("no")`
would be True). A parameter given twice, an empty name or key, or an item without `=` is refused.
Parameters the codec does not declare (e.g. distributed PowerSGD's hook settings) pass through as
read; whoever consumes them checks their names and types.
"""

from __future__ import annotations

import json
from typing import Any

from geotrain.codecs.base import CodecError, parse_flag
from geotrain.codecs.registry import CODECS, codec_params

MAX_SPEC_CHARS = 1000
"""Longer specs are refused (nothing needs more; keeps error messages and parsing bounded)."""


def parse_codec_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """(codec name, parameters) of a spec; CodecError names the spec and the offending item."""
    if not isinstance(spec, str) or len(spec) > MAX_SPEC_CHARS:
        raise CodecError(f"codec spec must be a string of at most {MAX_SPEC_CHARS} characters, got {str(spec)[:60]!r}")
    name, _, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise CodecError(f"codec {spec!r}: missing codec name")
    declared = codec_params(name) if name in CODECS else {}
    params: dict[str, Any] = {}
    for item in filter(str.strip, rest.split(",")):
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CodecError(f"codec {spec!r}: parameter {item.strip()!r} must look like key=value")
        if key in params:
            raise CodecError(f"codec {spec!r}: parameter {key!r} given twice")
        if isinstance(declared.get(key), bool):
            params[key] = parse_flag(text, f"codec {spec!r}: {key}")
        else:
            params[key] = _value(text)
    return name, params


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text.strip()
