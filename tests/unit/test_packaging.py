"""The package declares ranges, this repository pins its environment: every requirement of pyproject.toml
(extras included) is pinned in constraints.txt inside its declared range, the Makefile installs through the
constraints file, and the quick start names the versions the constraints pin."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from paths import ROOT


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin (name==version)"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(text) for text in listed]


def test_every_requirement_is_pinned_inside_its_declared_range():
    pins = _pins()
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} has no pin in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), \
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject's {requirement}"


def test_the_core_libraries_are_declared_as_ranges_not_pins():
    declared = {canonicalize_name(r.name): r.specifier for r in _requirements()}
    pinned = [name for name, specifier in declared.items() if any(s.operator == "==" for s in specifier)]
    assert pinned == [], f"pyproject pins {pinned} (exact versions belong in constraints.txt)"
    for name in ("torch", "transformers", "torchft"):
        operators = {spec.operator for spec in declared[name]}
        assert "==" not in operators and ">=" in operators and "<" in operators, (name, str(declared[name]))
    assert not declared["torch"].contains("2.5.0") and declared["torch"].contains("2.15.0")


def test_the_makefile_installs_through_the_constraints_file():
    makefile = (ROOT / "Makefile").read_text()
    installs = [line.strip() for line in makefile.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs and all("-c $(CONSTRAINTS)" in line for line in installs), installs
    assert re.search(r"^CONSTRAINTS := constraints\.txt$", makefile, re.M)


def test_the_quick_start_names_the_pinned_versions():
    pins = _pins()
    text = " ".join((ROOT / "docs" / "guide" / "quick-start.md").read_text().split())
    for name in ("torch", "transformers", "torchft"):
        assert f"{name} {pins[name]}" in text, f"quick-start.md does not say {name} {pins[name]} was tested"
