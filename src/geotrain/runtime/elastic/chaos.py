"""Failures to inject into an elastic run (`--chaos`), parsed once and turned into a schedule that is a
pure function of (spec, replica groups, seed).

    kill-site:every=20s                 SIGKILL one replica group every 20 s (wall seconds since the
                                        groups started), the group drawn from a seeded RNG
    kill-site:every=20s,site=1          always group 1
    kill-site:every=20s,first=5s,count=2  the first kill at 5 s, at most 2 kills
    kill-site:every=30s;kill-site:every=45s,site=0   several faults: ';' (or a new 'name:' after ',')

Durations: a number with unit ms, s, m or h (a bare number is seconds). `partition` (cutting a group's
links and healing them) needs the emulating backend around torchft's process groups and is refused
with one line. The launcher (runtime/elastic/launch.py) kills the group due at each time if it is
running; a group that is down at that moment is not killed twice (the kill is skipped).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from geotrain.errors import GeotrainError, shown

FAULTS = ("kill-site",)
REFUSED_FAULTS = {"partition": "partition chaos needs the emulating backend around torchft's process groups, "
                               "which elastic runs do not have yet; only kill-site is supported"}
KILL_KEYS = ("every", "site", "first", "count")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ChaosSpecError(GeotrainError, ValueError):
    """A --chaos spec that cannot be parsed (names the part, the value and what is allowed)."""


@dataclass(frozen=True)
class KillSite:
    """SIGKILL a replica group every `every_s` seconds, the first at `first_s` (default `every_s`);
    `site`: always this group (None: drawn from the seed); `count`: at most this many kills (None: no limit)."""

    every_s: float
    first_s: float | None = None
    site: int | None = None
    count: int | None = None

    @property
    def start_s(self) -> float:
        return self.every_s if self.first_s is None else self.first_s


@dataclass(frozen=True)
class Kill:
    """One scheduled kill: at `at_s` seconds after the groups started, group `group`."""

    at_s: float
    group: int


def parse_duration_s(text: str, where: str) -> float:
    """'20s', '500ms', '1.5m', '2h' or '7' (seconds) as seconds (> 0, finite)."""
    match = _DURATION.match(text)
    value = float(match.group(1)) * _UNIT_S[match.group(2)] if match else math.nan
    if not (math.isfinite(value) and value > 0):
        raise ChaosSpecError(f"chaos {where}: duration must be a number > 0 with unit ms, s, m or h, "
                             f"got {shown(text)}")
    return value


def _count(text: str, where: str, low: int) -> int:
    if not re.fullmatch(r"\s*[0-9]+\s*", text) or int(text) < low:
        raise ChaosSpecError(f"chaos {where}: must be an integer >= {low}, got {shown(text)}")
    return int(text)


def _fault_parts(spec: str) -> list[tuple[str, list[str]]]:
    """`spec` as [(fault name, ["key=value", ...])]: faults split at ';' and at a ',' item holding ':'."""
    faults: list[tuple[str, list[str]]] = []
    for chunk in spec.split(";"):
        for item in chunk.split(","):
            item = item.strip()
            if ":" in item:
                name, _, first = item.partition(":")
                faults.append((name.strip(), [first] if first.strip() else []))
            elif not faults:
                raise ChaosSpecError(f"chaos: a fault starts with its name and ':' (known: {', '.join(FAULTS)}), "
                                     f"got {shown(spec)}")
            elif item:
                faults[-1][1].append(item)
    return faults


def _kill_site(pairs: list[str]) -> KillSite:
    values: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip()
        if not eq or key not in KILL_KEYS:
            raise ChaosSpecError(f"chaos kill-site: {shown(pair)} is not one of {', '.join(k + '=' for k in KILL_KEYS)}")
        if key in values:
            raise ChaosSpecError(f"chaos kill-site: {key} given twice")
        values[key] = value.strip()
    if "every" not in values:
        raise ChaosSpecError("chaos kill-site: needs every=DURATION (e.g. kill-site:every=20s)")
    return KillSite(parse_duration_s(values["every"], "kill-site every"),
                    parse_duration_s(values["first"], "kill-site first") if "first" in values else None,
                    _count(values["site"], "kill-site site", 0) if "site" in values else None,
                    _count(values["count"], "kill-site count", 1) if "count" in values else None)


def parse_chaos(spec: str) -> tuple[KillSite, ...]:
    """The faults of a --chaos spec (see the module doc); ChaosSpecError, one line, otherwise."""
    if not isinstance(spec, str) or not spec.strip():
        raise ChaosSpecError(f"chaos: needs at least one fault, e.g. kill-site:every=20s, got {shown(spec)}")
    faults = []
    for name, pairs in _fault_parts(spec):
        if name in REFUSED_FAULTS:
            raise ChaosSpecError(f"chaos {name}: {REFUSED_FAULTS[name]}")
        if name not in FAULTS:
            raise ChaosSpecError(f"chaos: unknown fault {shown(name)} (known: {', '.join(FAULTS)})")
        faults.append(_kill_site(pairs))
    return tuple(faults)


def check_sites(faults: tuple[KillSite, ...], groups: int) -> None:
    """Every fixed `site` names one of the run's `groups` replica groups."""
    for fault in faults:
        if fault.site is not None and fault.site >= groups:
            raise ChaosSpecError(f"chaos kill-site: site must be a replica group in 0..{groups - 1}, got {fault.site}")


MAX_KILLS_PER_FAULT = 10_000
"""A fault without `count` is cut here (a kill every second for almost three hours)."""


def kill_schedule(faults: tuple[KillSite, ...], groups: int, seed: int, horizon_s: float = math.inf) -> list[Kill]:
    """Every kill due before `horizon_s` seconds (at most `count`, and MAX_KILLS_PER_FAULT, per fault), in time
    order; the drawn groups come from `seed` (numpy's default_rng), one stream per fault, so the same seed
    gives the same schedule."""
    kills = []
    for index, fault in enumerate(faults):
        rng = np.random.default_rng([seed, index])
        at, done = fault.start_s, 0
        limit = MAX_KILLS_PER_FAULT if fault.count is None else min(fault.count, MAX_KILLS_PER_FAULT)
        while at < horizon_s and done < limit:
            group = fault.site if fault.site is not None else int(rng.integers(groups))
            kills.append(Kill(at, group))
            at, done = at + fault.every_s, done + 1
    return sorted(kills, key=lambda kill: (kill.at_s, kill.group))
