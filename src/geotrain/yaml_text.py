"""Reading cluster, job and plan files: one bounded, strict loader for YAML and JSON text.

The rules (docs/history/placement.md, "File format rules"):
- at most MAX_FILE_BYTES (64 MiB) are read: a larger file, or an endless one like /dev/zero, is
  refused after reading MAX_FILE_BYTES + 1 bytes;
- the text must be UTF-8 (a UTF-8 byte-order mark is allowed) without NUL bytes: binary files and
  UTF-16 text are refused with a clear error;
- scalars follow the YAML 1.2 core schema, as JSON does: `010` is 10, `1:30`, `yes`, `no`, `on`,
  `off`, `1_000` and `2024-01-01` are strings; booleans are only true/false (True, TRUE...);
  `0x1F` / `0o17` are hexadecimal / octal integers; `1e3` and `1.3e9` are floats;
- integers must fit in 64 bits (|n| < 2**63);
- anchors (`&a`), aliases (`*a`), merge keys and explicit tags other than the core ones are refused
  (so a small file cannot expand into a huge document);
- a key given twice in one mapping is refused, naming the key;
- at most MAX_DEPTH levels of nesting. JSON text (starting with `{` or `[`) is parsed by the json
  module under the same rules, up to the byte cap and MAX_JSON_CONTAINERS lists and mappings
  (64 MiB of numbers: a few seconds, < 1 GB); other (YAML) text goes through PyYAML's pure-Python
  parser (~1 MB/s, ~0.7 KB per value), so it may hold at most MAX_YAML_BYTES (4 MiB) and
  MAX_YAML_NODES (250,000) values: a few seconds and ~200 MB at worst. Large files: write JSON.
Every failure raises DocumentError (a GeotrainError) naming the source and, where known, the line;
a loader turns it into its own error type with `document_errors_as(JobError)` (same message).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from geotrain.errors import GeotrainError, shown

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 64
MAX_YAML_BYTES = 4 * 1024 * 1024
MAX_YAML_NODES = 250_000
MAX_JSON_CONTAINERS = 100_000
INT_LIMIT = 2**63
_CORE_TAGS = {f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "seq", "map")}


def located(source: str, where: str, problem: str) -> str:
    """The one-line message of a file problem: `source: where: problem` (`source: problem` when where is empty)."""
    return f"{source}: {where}: {problem}" if where else f"{source}: {problem}"


class DocumentError(GeotrainError, ValueError):
    """A file cannot be read as a document: `source: where: problem` (where may be empty)."""

    def __init__(self, source: str, where: str, problem: str) -> None:
        self.source, self.where, self.problem = source, where, problem
        super().__init__(located(source, where, problem))


@contextmanager
def document_errors_as(error_type: type[GeotrainError]) -> Iterator[None]:
    """Inside the block, a DocumentError is raised again as `error_type` with the same one-line message
    (and no chained traceback): each loader (job, plan, cluster) reports its own error type."""
    try:
        yield
    except DocumentError as exc:
        raise error_type(str(exc)) from None


def _integer(text: str) -> int:
    """A YAML 1.2 core / JSON integer; ValueError when it does not fit in 64 bits."""
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    if digits.startswith("0x"):
        value = int(digits[2:], 16) if len(digits) <= 20 else INT_LIMIT
    elif digits.startswith("0o"):
        value = int(digits[2:], 8) if len(digits) <= 25 else INT_LIMIT
    else:
        value = int(digits, 10) if len(digits) <= 20 else INT_LIMIT
    if value >= INT_LIMIT:
        raise ValueError(f"integer out of range (|n| must be < 2**63), got {shown(text)}")
    return sign * value


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars, no anchors/aliases/tags, no duplicate keys, bounded size."""

    yaml_implicit_resolvers: dict = {}
    yaml_constructors = dict(yaml.SafeLoader.yaml_constructors)

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def _refuse(self, problem: str, event: Any) -> yaml.YAMLError:
        return yaml.composer.ComposerError(None, None, problem, event.start_mark)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            name = shown(event.anchor, 30)[1:-1]
            raise self._refuse(f"aliases are not allowed (*{name}); write the value out", event)
        if event.anchor is not None:
            raise self._refuse(f"anchors are not allowed (&{shown(event.anchor, 30)[1:-1]})", event)
        tag = getattr(event, "tag", None)
        if tag not in (None, "!") and tag not in _CORE_TAGS:
            raise self._refuse(f"tag {shown(tag)} is not allowed", event)
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            raise self._refuse(f"more than {MAX_YAML_NODES:,} values in YAML (write large files as JSON)", event)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise self._refuse(f"nested more than {MAX_DEPTH} levels deep", event)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(None, None, f"expected a mapping, got {node.id}", node.start_mark)
        mapping: dict = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in mapping
            except TypeError:
                raise yaml.constructor.ConstructorError("while reading a mapping", node.start_mark,
                                                        "a key must be a plain value", key_node.start_mark) from None
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"duplicate key {shown(key)}", key_node.start_mark)
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping

    def construct_yaml_int(self, node: Any) -> int:
        try:
            return _integer(self.construct_scalar(node))
        except ValueError as exc:
            raise yaml.constructor.ConstructorError(None, None, str(exc), node.start_mark) from None

    def construct_yaml_float(self, node: Any) -> float:
        text = self.construct_scalar(node).lower()
        if text.lstrip("+-") == ".inf":
            return -math.inf if text.startswith("-") else math.inf
        return math.nan if text == ".nan" else float(text)

    def construct_yaml_bool(self, node: Any) -> bool:
        return self.construct_scalar(node).lower() == "true"


for _tag, _pattern, _first in (
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    ("float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
              r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", "-+0123456789."),
):
    _Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(_pattern), list(_first))
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)
_Loader.add_constructor("tag:yaml.org,2002:bool", _Loader.construct_yaml_bool)


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict:
    mapping: dict = {}
    for key, value in pairs:
        if key in mapping:
            raise ValueError(f"duplicate key {shown(key)}")
        mapping[key] = value
    return mapping


def _json_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON (write .nan / .inf in YAML if you must)")


def _check_json_values(doc: Any, source: str) -> None:
    """Depth at most MAX_DEPTH and every int within 64 bits, level by level (only containers are kept
    between levels; a flat list of numbers is checked by C-level set/min/max, not a Python loop)."""
    level, depth = [doc], 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise DocumentError(source, "", f"nested more than {MAX_DEPTH} levels deep")
        deeper: list = []
        for container in level:
            children = list(container.values()) if type(container) is dict else container
            kinds = set(map(type, children))
            if list in kinds or dict in kinds:
                deeper.extend(child for child in children if type(child) is list or type(child) is dict)
            if int in kinds:
                ints = children if kinds == {int} else [child for child in children if type(child) is int]
                for extreme in (min(ints), max(ints)):
                    if not -INT_LIMIT < extreme < INT_LIMIT:
                        raise DocumentError(source, "", f"integer out of range (|n| must be < 2**63), "
                                                        f"got {shown(extreme)}")
        level = deeper


def _parse_json(text: str, source: str) -> tuple[bool, Any]:
    """(True, document) when `text` is JSON; (False, None) when it is not (then it may still be YAML)."""
    containers = text.count("[") + text.count("{")  # an upper bound, counted in C before parsing
    if containers > MAX_JSON_CONTAINERS:
        raise DocumentError(source, "", f"more than {MAX_JSON_CONTAINERS:,} lists and mappings")
    try:
        doc = json.loads(text, object_pairs_hook=_json_pairs, parse_constant=_json_constant)
    except json.JSONDecodeError:
        return False, None
    except RecursionError:
        raise DocumentError(source, "", f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # from the hooks (duplicate key, NaN) or an integer of over 4300 digits
        problem = "integer out of range (|n| must be < 2**63)" if "integer string" in str(exc) else str(exc)
        raise DocumentError(source, "", problem) from None
    if isinstance(doc, (dict, list)):
        _check_json_values(doc, source)
    elif type(doc) is int and not -INT_LIMIT < doc < INT_LIMIT:
        raise DocumentError(source, "", f"integer out of range (|n| must be < 2**63), got {shown(doc)}")
    return True, doc


def parse_document(text: str, source: str = "<text>") -> Any:
    """Parse YAML or JSON text under the module's rules; DocumentError names `source` and the line."""
    if len(text) > MAX_FILE_BYTES:
        raise DocumentError(source, "", f"larger than {MAX_FILE_BYTES // 2**20} MiB")
    if "\x00" in text:
        raise DocumentError(source, "", "binary data (NUL bytes), not YAML/JSON text")
    if text.lstrip()[:1] in ("{", "["):
        is_json, doc = _parse_json(text, source)
        if is_json:
            return doc
    if len(text) > MAX_YAML_BYTES:
        raise DocumentError(source, "", f"YAML text larger than {MAX_YAML_BYTES // 2**20} MiB "
                                        f"(write large files as JSON: up to {MAX_FILE_BYTES // 2**20} MiB)")
    loader = None
    try:
        loader = _Loader(text)  # its reader refuses control characters right here
        return loader.get_single_data()
    except yaml.reader.ReaderError as exc:
        raise DocumentError(source, "", f"not valid YAML/JSON: control character {exc.character!r} "
                                        f"at offset {exc.position} is not allowed") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise DocumentError(source, where, f"not valid YAML/JSON: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:  # a safety net: compose_node stops at MAX_DEPTH long before Python's limit
        raise DocumentError(source, "", f"nested more than {MAX_DEPTH} levels deep") from None
    finally:
        if loader is not None:
            loader.dispose()


def decode_text(data: bytes, source: str) -> str:
    """UTF-8 text of a file's bytes; refuses UTF-16, binary data and invalid UTF-8 with a clear error."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise DocumentError(source, "", "UTF-16 text; save the file as UTF-8")
    if b"\x00" in data:
        raise DocumentError(source, "", "binary data (NUL bytes), not YAML/JSON text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        raise DocumentError(source, "", problem) from None


def read_text_file(path: str | Path) -> str:
    """The UTF-8 text of a file, reading at most MAX_FILE_BYTES + 1 bytes."""
    source = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except IsADirectoryError:
        raise DocumentError(source, "", "is a directory, not a file") from None
    except OSError as exc:
        raise DocumentError(source, "", f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(source, "", f"larger than {MAX_FILE_BYTES // 2**20} MiB")
    return decode_text(data, source)


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes every string that YAML 1.1 *or* this module's 1.2 rules would read as
    something else (e.g. a name "1e3" or "0o17"), so that written files read back unchanged."""


for _first, _resolvers in _Loader.yaml_implicit_resolvers.items():
    for _tag, _regexp in _resolvers:
        _Dumper.add_implicit_resolver(_tag, _regexp, [_first])


def _printable(doc: Any) -> bool:
    """True when every string (key or value) in `doc` is printable (no line separators like U+0085)."""
    stack = [doc]
    while stack:
        value = stack.pop()
        if isinstance(value, str) and not value.isprintable():
            return False
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return True


def dump_yaml_text(doc: Any) -> str:
    """YAML text of a plain document (dicts, lists, str, int, float, bool, None), keys in order.
    Non-ASCII letters are written as they are unless some string holds a non-printable character
    (PyYAML would write U+0085 unquoted and read it back as a space): then everything is escaped."""
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=None, allow_unicode=_printable(doc))
