"""The project keeps each config dataclass at 20 fields or fewer: a wider one is split into sections.

A config is a frozen dataclass under src/geotrain whose name ends in Config, Options, Section or Settings
(read from the source, so that every module counts without importing it)."""

import ast
from pathlib import Path

from paths import ROOT

MAX_FIELDS = 20
CONFIG_SUFFIXES = ("Config", "Options", "Section", "Settings")


def _is_frozen_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "dataclass":
            if any(k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in decorator.keywords):
                return True
    return False


def config_field_counts(root: Path) -> dict[str, int]:
    """`path:Class` -> its dataclass field count (annotated names, ClassVar aside), per config class."""
    counts = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith(CONFIG_SUFFIXES) and _is_frozen_dataclass(node):
                counts[f"{path.relative_to(root)}:{node.name}"] = sum(
                    1 for item in node.body
                    if isinstance(item, ast.AnnAssign) and "ClassVar" not in ast.unparse(item.annotation))
    return counts


def test_every_config_dataclass_has_at_most_20_fields():
    counts = config_field_counts(ROOT / "src" / "geotrain")
    # the scan finds the configs it is about (a renamed folder must not make this pass on nothing)
    assert {"sync/options.py:SyncOptions", "runtime/config.py:RuntimeConfig",
            "runtime/sections.py:OptimSection"} <= counts.keys()
    assert counts["runtime/config.py:RuntimeConfig"] == 13
    wide = {name: n for name, n in counts.items() if n > MAX_FIELDS}
    assert wide == {}, f"config dataclasses over {MAX_FIELDS} fields (split them into sections): {wide}"
