"""Failures to inject into an elastic run (`--chaos`), parsed once and turned into a schedule that is a
pure function of (spec, replica groups, seed).

    kill-site:every=20s                 SIGKILL one replica group every 20 s (seconds of training since the
                                        first start-up quorum), the group drawn from a seeded RNG
    kill-site:every=20s,site=1          always group 1
    kill-site:every=20s,site=host       always the group that hosts the global model's server when the kill is due
                                        (elastic --outer-sync async*: its host moves by election)
    kill-site:every=20s,first=5s,count=2  the first kill at 5 s, at most 2 kills
    partition:site=1,at=5s,for=3s       cut group 1's links at 5 s, heal them at 8 s
    partition:at=5s,for=3s,every=20s,count=2   a partition every 20 s from 5 s, twice, the group drawn
    kill-site:every=30s;kill-site:every=45s,site=0   several faults: ';' (or a new 'name:' after ',')
    slow:site=2,factor=3,at=10s         from 10 s of training on, replica 2 computes 3x slower (a run without
                                        --elastic: runtime/slowdown.py; `at` defaults to 0; the factors of
                                        one site, multiplied, at most MAX_SLOW_FACTOR)

Durations: a number with unit ms, s, m or h (a bare number is seconds);
a slow-down's `at` may be 0. A partition is a link state
of the emulating backend (runtime/elastic/links.py): the launcher cuts the group's links and heals them;
the group stays up; a cut lasts its `for` from when the launcher makes it, however late (`cut_heal_s`).
The launcher (runtime/elastic/launch.py) kills the group due at each time if it is running; a group that is down at that moment is not killed twice (the kill is skipped), nor is a
group partitioned twice at once.
"""


from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from geotrain.errors import GeotrainError, shown

FAULTS = ("kill-site", "partition", "slow")
KILL_KEYS = ("every", "site", "first", "count")
HOST_SITE = "host"
"""kill-site's site=host: the group hosting the global model's server (elastic asynchronous runs)."""
PARTITION_KEYS = ("site", "at", "for", "every", "count")
SLOW_KEYS = ("site", "factor", "at")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
MAX_SLOW_FACTOR = 1e6
"""The largest slow-down (all of a site's slow faults multiplied): a 10 ms step becomes almost 3 hours. Beyond it
a fault tests nothing more, and the emulated clock's arithmetic would overflow (1e300 did, blaming another rank)."""


class ChaosSpecError(GeotrainError, ValueError):
    """A --chaos spec that cannot be parsed (names the part, the value and what is allowed)."""


@dataclass(frozen=True)
class KillSite:
    """SIGKILL a replica group every `every_s` seconds, the first at `first_s` (default `every_s`);
    `site`: always this group (None: drawn from the seed); `count`: at most this many kills (None: no limit);
    `host`: always the group hosting the global model's server when the kill is due (`site=host`; site None)."""

    every_s: float
    first_s: float | None = None
    site: int | None = None
    count: int | None = None
    host: bool = False

    @property
    def start_s(self) -> float:
        return self.every_s if self.first_s is None else self.first_s

    @property
    def period_s(self) -> float:
        return self.every_s


@dataclass(frozen=True)
class Partition:
    """Cut a replica group's links at `at_s` for `for_s` seconds, then heal them; again every `every_s`
    (None: once) at most `count` times (None: once without `every_s`, else no limit); `site`: always
    this group (None: drawn from the seed)."""

    at_s: float
    for_s: float
    site: int | None = None
    every_s: float | None = None
    count: int | None = None

    @property
    def start_s(self) -> float:
        return self.at_s

    @property
    def period_s(self) -> float:
        return math.inf if self.every_s is None else self.every_s


@dataclass(frozen=True)
class Slow:
    """Replica (site) `site`'s compute runs `factor` times slower (factor >= 1) from `at_s` seconds of
    training on (the worker applies it: runtime/slowdown.py)."""

    site: int
    factor: float
    at_s: float = 0.0


Fault = KillSite | Partition | Slow


@dataclass(frozen=True)
class Kill:
    """One scheduled kill: at `at_s` seconds after the groups started, group `group` (None: the group hosting the
    global model's server then, which the launcher looks up: `site=host`)."""

    at_s: float
    group: int | None


@dataclass(frozen=True)
class Cut:
    """One scheduled partition: group `group`'s links cut from `at_s` to `heal_s` (seconds after the start)."""

    at_s: float
    group: int
    heal_s: float


def cut_heal_s(cut: Cut, cut_at_s: float) -> float:
    """When the links of `cut`, cut at `cut_at_s` seconds after the start, heal (seconds after the start): its
    whole duration after the cut, however late the launcher made it (a launcher held up past `heal_s`, e.g. a
    loaded machine starting processes, would otherwise cut and heal at once: a partition no group notices)."""
    return max(cut.heal_s, cut_at_s + (cut.heal_s - cut.at_s))


def parse_duration_s(text: str, where: str) -> float:
    """'20s', '500ms', '1.5m', '2h' or '7' (seconds) as seconds (> 0, finite)."""
    match = _DURATION.match(text)
    value = float(match.group(1)) * _UNIT_S[match.group(2)] if match else math.nan
    if not (math.isfinite(value) and value > 0):
        raise ChaosSpecError(f"chaos {where}: duration must be a number > 0 with unit ms, s, m or h, "
                             f"got {shown(text)}")
    return value


def _at_s(text: str, where: str) -> float:
    """A duration as parse_duration_s, or 0 ('0', '0s', '0ms')."""
    match = _DURATION.match(text)
    if match and float(match.group(1)) == 0:
        return 0.0
    return parse_duration_s(text, where)


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


def _values(name: str, pairs: list[str], keys: tuple[str, ...]) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip()
        if not eq or key not in keys:
            raise ChaosSpecError(f"chaos {name}: {shown(pair)} is not one of {', '.join(k + '=' for k in keys)}")
        if key in values:
            raise ChaosSpecError(f"chaos {name}: {key} given twice")
        values[key] = value.strip()
    return values


def _kill_site(pairs: list[str]) -> KillSite:
    values = _values("kill-site", pairs, KILL_KEYS)
    if "every" not in values:
        raise ChaosSpecError("chaos kill-site: needs every=DURATION (e.g. kill-site:every=20s)")
    host = values.get("site") == HOST_SITE
    return KillSite(parse_duration_s(values["every"], "kill-site every"),
                    parse_duration_s(values["first"], "kill-site first") if "first" in values else None,
                    _kill_site_number(values["site"]) if "site" in values and not host else None,
                    _count(values["count"], "kill-site count", 1) if "count" in values else None, host)


def _kill_site_number(text: str) -> int:
    try:
        return _count(text, "kill-site site", 0)
    except ChaosSpecError as exc:
        raise ChaosSpecError(f"{exc} (or {HOST_SITE}: the global model's host)") from None


def _partition(pairs: list[str]) -> Partition:
    values = _values("partition", pairs, PARTITION_KEYS)
    if "for" not in values:
        raise ChaosSpecError("chaos partition: needs for=DURATION (e.g. partition:site=1,at=5s,for=3s)")
    if "at" not in values and "every" not in values:
        raise ChaosSpecError("chaos partition: needs at=DURATION or every=DURATION (when the first cut starts)")
    for_s = parse_duration_s(values["for"], "partition for")
    every_s = parse_duration_s(values["every"], "partition every") if "every" in values else None
    if every_s is not None and every_s <= for_s:
        raise ChaosSpecError(f"chaos partition: every must be more than for ({for_s:g} s: a partition heals "
                             f"before the next one), got {every_s:g} s")
    at_s = parse_duration_s(values["at"], "partition at") if "at" in values else every_s
    return Partition(at_s, for_s, _count(values["site"], "partition site", 0) if "site" in values else None,
                     every_s, _count(values["count"], "partition count", 1) if "count" in values else None)


def _slow(pairs: list[str]) -> Slow:
    values = _values("slow", pairs, SLOW_KEYS)
    if "site" not in values or "factor" not in values:
        raise ChaosSpecError("chaos slow: needs site=K and factor=F (e.g. slow:site=2,factor=3,at=10s)")
    try:
        factor = float(values["factor"])
    except ValueError:
        factor = math.nan
    if not (math.isfinite(factor) and 1 <= factor <= MAX_SLOW_FACTOR):
        raise ChaosSpecError(f"chaos slow factor: must be a number in 1..{MAX_SLOW_FACTOR:g} (how many times "
                             f"slower), got {shown(values['factor'])}")
    return Slow(_count(values["site"], "slow site", 0), factor,
                _at_s(values["at"], "slow at") if "at" in values else 0.0)


_PARSERS = {"kill-site": _kill_site, "partition": _partition, "slow": _slow}


def parse_chaos(spec: str) -> tuple[Fault, ...]:
    """The faults of a --chaos spec (see the module doc); ChaosSpecError, one line, otherwise."""
    if not isinstance(spec, str) or not spec.strip():
        raise ChaosSpecError(f"chaos: needs at least one fault, e.g. kill-site:every=20s, got {shown(spec)}")
    faults: list[Fault] = []
    for name, pairs in _fault_parts(spec):
        if name not in FAULTS:
            raise ChaosSpecError(f"chaos: unknown fault {shown(name)} (known: {', '.join(FAULTS)})")
        faults.append(_PARSERS[name](pairs))
    _check_slow_product(faults)
    return tuple(faults)


def _check_slow_product(faults: list[Fault]) -> None:
    """The slow faults of one site multiply once due (runtime/slowdown.py): their product is at most
    MAX_SLOW_FACTOR too."""
    product: dict[int, float] = {}
    for fault in faults:
        if isinstance(fault, Slow):
            product[fault.site] = product.get(fault.site, 1.0) * fault.factor
    for site, factor in sorted(product.items()):
        if factor > MAX_SLOW_FACTOR:
            raise ChaosSpecError(f"chaos slow factor: the factors of site {site} multiply to {factor:g}, more than "
                                 f"{MAX_SLOW_FACTOR:g}")


def slow_only(spec: str) -> bool:
    """Whether a valid --chaos spec holds slow-down faults only (which a run without --elastic applies)."""
    return all(isinstance(fault, Slow) for fault in parse_chaos(spec))


def kills_host(spec: str) -> bool:
    """Whether a --chaos spec (valid or not: False if it does not parse) kills the global model's host (site=host)."""
    try:
        return any(isinstance(fault, KillSite) and fault.host for fault in parse_chaos(spec))
    except ChaosSpecError:
        return False


def has_partition(spec: str) -> bool:
    """Whether a --chaos spec (valid or not: False if it does not parse) cuts links."""
    try:
        return any(isinstance(fault, Partition) for fault in parse_chaos(spec))
    except ChaosSpecError:
        return False


def check_sites(faults: tuple[Fault, ...], groups: int) -> None:
    """Every fixed `site` names one of the run's `groups` replica groups."""
    for fault in faults:
        if fault.site is not None and fault.site >= groups:
            name = {KillSite: "kill-site", Partition: "partition", Slow: "slow"}[type(fault)]
            raise ChaosSpecError(f"chaos {name}: site must be a replica group in 0..{groups - 1}, got {fault.site}")


MAX_KILLS_PER_FAULT = 10_000
"""A fault without `count` is cut here (a kill every second for almost three hours)."""


def _events(faults: tuple[Fault, ...], kind: type, groups: int, seed: int,
            horizon_s: float) -> list[tuple[float, int | None, Fault]]:
    """(time, group, fault) of every event of the faults of `kind` due before `horizon_s`: at most `count`
    (a partition without `every` and `count`: one) and MAX_KILLS_PER_FAULT per fault; the drawn groups come
    from `seed` (numpy's default_rng), one stream per fault (its index in `faults`); a kill of `site=host`: None."""
    events = []
    for index, fault in enumerate(faults):
        if not isinstance(fault, kind):
            continue
        rng = np.random.default_rng([seed, index])
        once = isinstance(fault, Partition) and fault.every_s is None and fault.count is None
        limit = 1 if once else min(fault.count or MAX_KILLS_PER_FAULT, MAX_KILLS_PER_FAULT)
        at, done = fault.start_s, 0
        while at < horizon_s and done < limit:
            group = fault.site if fault.site is not None or getattr(fault, "host", False) \
                else int(rng.integers(groups))
            events.append((at, group, fault))
            at, done = at + fault.period_s, done + 1
    return sorted(events, key=lambda event: (event[0], -1 if event[1] is None else event[1]))


def kill_schedule(faults: tuple[Fault, ...], groups: int, seed: int, horizon_s: float = math.inf) -> list[Kill]:
    """Every kill due before `horizon_s` seconds, in time order (the same seed gives the same schedule)."""
    return [Kill(at, group) for at, group, _ in _events(faults, KillSite, groups, seed, horizon_s)]


def partition_schedule(faults: tuple[Fault, ...], groups: int, seed: int,
                       horizon_s: float = math.inf) -> list[Cut]:
    """Every partition starting before `horizon_s` seconds, in time order (the same seed gives the same one)."""
    return [Cut(at, group, at + fault.for_s)  # type: ignore[union-attr]
            for at, group, fault in _events(faults, Partition, groups, seed, horizon_s)]
