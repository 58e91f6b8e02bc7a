"""Codec specs as written on command lines: `"topk"`, `"topk:fraction=0.01,value_dtype=fp16"`.

    name, params = parse_codec_spec("randk:fraction=0.1,allow_nonfinite=no")
    codec = get_codec(name, **params)       # ('randk', {'fraction': 0.1, 'allow_nonfinite': False})
    spec = CodecSpec.parse("topk:fraction=0.01")   # typed: spec.name, spec.kwargs(), spec.build(), str(spec)

The one parser of codec specs. Values read as JSON where they parse (numbers, strings in quotes),
else as the stripped text. Flags are parsed strictly: true/false, yes/no, 1/0 (any case) give a
bool for every parameter whose default is a bool, and any other value is refused (`bool("no")`
would be True). A parameter given twice, an empty name or key, or an item without `=` is refused.
Parameters the codec does not declare (e.g. distributed PowerSGD's hook settings) pass through as
read; whoever consumes them checks their names and types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from geotrain.codecs.base import Codec, CodecError, parse_flag
from geotrain.codecs.cast import NoneCodec
from geotrain.codecs.registry import CODECS, codec_params

NESTED_SEP = "/"
"""Separates a nested spec's name and parameters (`CodecSpec.parse_nested`)."""

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


@dataclass(frozen=True)
class CodecSpec:
    """A parsed codec spec: the codec (or reducer) name and its parameters, in the order written.

    Parse once at the edge (`CodecSpec.parse`), then pass this around; `str(spec)` writes a spec
    that parses back to an equal one, so configs can print and re-read it. `params` may hold names
    the codec does not declare (a reducer's knobs, e.g. distributed PowerSGD's): `build` checks them.
    """

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, spec: "str | CodecSpec") -> "CodecSpec":
        """The spec of `spec` (a CodecSpec passes through); CodecError names the bad item."""
        if isinstance(spec, CodecSpec):
            return spec
        name, params = parse_codec_spec(spec)
        return cls(name, tuple(params.items()))

    @classmethod
    def uncompressed(cls) -> "CodecSpec":
        """The spec of the `none` codec: values travel as fp32, nothing dropped."""
        return cls(NoneCodec.name)

    @property
    def is_uncompressed(self) -> bool:
        """True for the `none` codec (whatever its parameters)."""
        return self.name == NoneCodec.name

    def kwargs(self) -> dict[str, Any]:
        """The parameters as keyword arguments."""
        return dict(self.params)

    def build(self) -> Codec:
        """A new codec of this spec (geotrain.codecs.get_codec); CodecError for unknown names or parameters."""
        from geotrain.codecs.registry import get_codec

        return get_codec(self.name, **self.kwargs())

    @classmethod
    def parse_nested(cls, text: str) -> "CodecSpec":
        """The spec of `text` written inside another spec's value, with `/` for both `:` and `,`
        (`topk-lowbit/fraction=0.0625/bits=4`, a plain name alone, or a `:` before the first parameter):
        neither splits the outer spec's items. CodecError names the text."""
        if not isinstance(text, str) or "," in text:
            raise CodecError(f"nested codec spec {text!r}: write name/key=value/... (no commas)")
        name, _, rest = text.replace(":", NESTED_SEP, 1).partition(NESTED_SEP)
        return cls.parse(name + (":" + ",".join(rest.split(NESTED_SEP)) if rest else ""))

    def nested(self) -> str:
        """This spec as text `parse_nested` reads back to an equal spec."""
        return NESTED_SEP.join((self.name, *(f"{key}={_text(value)}" for key, value in self.params)))

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{key}={_text(value)}" for key, value in self.params)


def _text(value: Any) -> str:
    """`value` as spec text that `_value` reads back to an equal value."""
    if isinstance(value, str) and _value(value) == value and not any(c in value for c in ",:="):
        return value
    return json.dumps(value)
