"""What picks and configures a gradient sync: `SyncOptions` (typed, checked where built) and the DP
group it runs on (`DPGroup`). Each bad value or combination is refused in one line naming it.

`SyncOptions` holds the optimizer and the run's steps, and composes four sections, each checking its own
fields: `ExchangeOptions` (the DP exchange's codec), `OuterOptions` (the outer step: DiLoCo's period H),
`StreamingOptions` (Streaming DiLoCo's fragments and overlap) and `HeterogeneityOptions` (per-replica local
steps, asynchronous outer updates). The rules between sections live in `SyncOptions`; a combination error
carries the dotted fields it is about (`SyncError.fields`, e.g. "outer.sync_every"), which the runtime
config maps to its keys. `SyncOptions.of(codec=..., sync_every=..., ...)` builds one from flat names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from geotrain.codecs import CodecError, CodecSpec
from geotrain.comm import check_reducer_spec, reducer_traits
from geotrain.comm.gather import GatherLinks
from geotrain.comm.hierarchical import HierarchicalGroups
from geotrain.optim.outer import DILOCO_LR, DILOCO_MOMENTUM, LANDINGS, OuterStepError, check_outer_settings
from geotrain.cost.memory import OUTER_STATES
from geotrain.optim.registry import RUNTIME_OPTIMIZERS
from geotrain.sync.adaptive import LOCAL_STEPS, check_adaptive_settings
from geotrain.cost.async_outer import STALENESS_POWER
from geotrain.sync.async_merge import ASYNC_MERGES
from geotrain.sync.async_outer import OUTER_SYNCS
from geotrain.sync.base import SyncError
from geotrain.sync.streaming import FRAGMENT_SPLITS


@dataclass(frozen=True)
class ExchangeOptions:
    """What travels between the replicas of a stage.

    codec: the DP exchange's codec / reducer spec (a string is parsed once, here).
    error_feedback: keep the residuals of what the codec dropped.
    hierarchical: full precision inside regions, the codec between them (geotrain.comm.hierarchical).
    """

    codec: CodecSpec
    error_feedback: bool = True
    hierarchical: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "codec", CodecSpec.parse(self.codec))
            check_reducer_spec(self.codec)
        except CodecError as exc:
            raise SyncError(f"ExchangeOptions.codec {str(self.codec)!r}: {exc}") from None
        _booleans(self, "error_feedback", "hierarchical")


@dataclass(frozen=True)
class OuterOptions:
    """The outer step (local SGD / DiLoCo); all unset: every step's gradients are exchanged.

    sync_every: H, the outer period in steps (None: no outer step).
    outer_lr, outer_momentum: the outer Nesterov SGD's (checked with sync_every).
    sync_moments: each outer sync also averages the inner AdamW's moments (geotrain.sync.moments).
    moment_syncs: with sync_moments, only each fragment's first `moment_syncs` outer syncs carry the moments;
        the later ones send the outer gradients alone (None: every sync).
    outer_state: where the outer state (anchors, outer momentum, exchanged outer gradients) lives: "device" (the
        parameters') or "host" (geotrain.optim.outer_state).
    """

    sync_every: int | None = None
    outer_lr: float = DILOCO_LR
    outer_momentum: float = DILOCO_MOMENTUM
    sync_moments: bool = False
    moment_syncs: int | None = None
    outer_state: str = "device"

    def __post_init__(self) -> None:
        if self.outer_state not in OUTER_STATES:
            raise SyncError(f"OuterOptions.outer_state must be one of {', '.join(OUTER_STATES)}, got "
                            f"{self.outer_state!r}")
        if self.outer_state != "device" and self.sync_every is None:
            raise SyncError("OuterOptions: outer_state says where DiLoCo's outer state lives: it needs sync_every",
                            ("outer.outer_state", "outer.sync_every"))
        if self.sync_every is not None:
            try:
                check_outer_settings(self.sync_every, self.outer_lr, self.outer_momentum, "OuterOptions")
            except OuterStepError as exc:
                raise SyncError(str(exc)) from None
        _booleans(self, "sync_moments")
        if self.moment_syncs is not None:
            if not _integer(self.moment_syncs) or self.moment_syncs < 1:
                raise SyncError(f"OuterOptions.moment_syncs must be an integer >= 1 (None: every outer sync), got "
                                f"{self.moment_syncs!r}")
            if not self.sync_moments:
                raise SyncError("OuterOptions: moment_syncs says how many outer syncs carry the moments: it needs "
                                "sync_moments", ("outer.moment_syncs", "outer.sync_moments"))


@dataclass(frozen=True)
class StreamingOptions:
    """Streaming DiLoCo (with sync_every; geotrain.sync.streaming), and the delay of delayed gradients.

    fragments: P fragments synced at staggered offsets within the outer period.
    fragment_split: how the fragments are cut (FRAGMENT_SPLITS): "layers" between tensors, "bytes" at equal
        bytes (splitting the tensors the cuts fall in).
    delay: tau, steps an exchange travels while compute goes on: with sync_every each fragment's sync lands
        `delay` steps after it starts; without it every step's gradients are applied tau steps after they were
        computed (geotrain.sync.delayed; 0: blocking).
    mix: the mix landing's alpha in [0, 1] (a late sync's mean mixed with the local progress).
    landing: how a late sync lands (geotrain.optim.outer.LANDINGS): "mix" (with `mix`) or "eager" (the local
        outer gradient applied at the start as the mean's proxy, the correction when the mean lands).
    warmup: syncs started before this step block (tau 0): the overlap starts after the outer warm-up.
    The bounds that depend on H or the run's steps (fragments <= H, delay < H) are SyncOptions'.
    """

    fragments: int = 1
    fragment_split: str = "layers"
    delay: int = 0
    mix: float = 0.0
    landing: str = "mix"
    warmup: int = 0

    def __post_init__(self) -> None:
        for name in ("fragments", "delay"):
            if not _integer(getattr(self, name)):
                raise SyncError(f"StreamingOptions.{name} must be an integer, got {getattr(self, name)!r}")
        if isinstance(self.mix, bool) or not isinstance(self.mix, int | float) or not 0.0 <= self.mix <= 1.0:
            raise SyncError(f"StreamingOptions.mix must be a number in [0, 1], got {self.mix!r}")
        if not _integer(self.warmup) or self.warmup < 0:
            raise SyncError(f"StreamingOptions.warmup must be an integer >= 0, got {self.warmup!r}")
        if self.fragment_split not in FRAGMENT_SPLITS:
            raise SyncError(f"StreamingOptions.fragment_split must be one of {', '.join(FRAGMENT_SPLITS)}, got "
                            f"{self.fragment_split!r}")
        if self.landing not in LANDINGS:
            raise SyncError(f"StreamingOptions.landing must be one of {', '.join(LANDINGS)}, got {self.landing!r}")
        if self.landing == "eager" and self.mix != 0:
            raise SyncError(f"StreamingOptions: mix {self.mix!r} is the mix landing's alpha; eager landing keeps the "
                            f"local progress itself: leave mix 0", ("streaming.landing", "streaming.mix"))

    @property
    def is_blocking_diloco(self) -> bool:
        """Whether every setting but the delay is the default (plain DiLoCo's one blocking fragment)."""
        return (self.fragments, self.fragment_split, self.mix, self.landing, self.warmup) == (1, "layers", 0.0,
                                                                                              "mix", 0)


@dataclass(frozen=True)
class HeterogeneityOptions:
    """Replicas of different speeds (with sync_every).

    local_steps: "equal" (H inner steps per outer period on every replica) or "adaptive" (H_r by measured
        speed, the plain outer mean: geotrain.sync.adaptive; one fragment, flat DiLoCo only).
    local_steps_prior_s: adaptive: relative seconds per step of each DP member (group order) before any is
        measured, which share out the first period (None: H each).
    outer_sync: "sync", or "async" / "async-hierarchical" (geotrain.sync.async_outer; OUTER_SYNCS).
    async_merge: what the asynchronous server does to an arriving outer gradient: "staleness" (as it came, weighed
        by delayed Nesterov) or "heloco" (its component opposing the server's recent updates removed when stale;
        geotrain.sync.async_merge; ASYNC_MERGES).
    async_staleness_power: p >= 0 of the asynchronous server's staleness weight (1 + s) ** -p (0: every update at full
        weight, as the inner steps it carries; geotrain.optim.delayed_nesterov).
    """

    local_steps: str = "equal"
    local_steps_prior_s: tuple[float, ...] | None = None
    outer_sync: str = "sync"
    async_merge: str = "staleness"
    async_staleness_power: float = STALENESS_POWER

    def __post_init__(self) -> None:
        if self.local_steps not in LOCAL_STEPS:
            raise SyncError(f"HeterogeneityOptions.local_steps must be one of {', '.join(LOCAL_STEPS)}, got "
                            f"{self.local_steps!r}")
        prior = self.local_steps_prior_s
        if prior is not None and (not isinstance(prior, tuple) or not all(
                not isinstance(s, bool) and isinstance(s, int | float) and math.isfinite(s) and s > 0 for s in prior)):
            raise SyncError(f"HeterogeneityOptions.local_steps_prior_s must be a tuple of finite seconds > 0 "
                            f"(or None), got {prior!r}")
        if self.outer_sync not in OUTER_SYNCS:
            raise SyncError(f"HeterogeneityOptions.outer_sync must be one of {', '.join(OUTER_SYNCS)}, got "
                            f"{self.outer_sync!r}")
        if self.async_merge not in ASYNC_MERGES:
            raise SyncError(f"HeterogeneityOptions.async_merge must be one of {', '.join(ASYNC_MERGES)}, got "
                            f"{self.async_merge!r}")
        power = self.async_staleness_power
        if isinstance(power, bool) or not isinstance(power, int | float) or not math.isfinite(power) or power < 0:
            raise SyncError(f"HeterogeneityOptions.async_staleness_power must be a finite number >= 0, got {power!r}")


SECTIONS = {"exchange": ExchangeOptions, "outer": OuterOptions, "streaming": StreamingOptions,
            "heterogeneity": HeterogeneityOptions}
"""SyncOptions' section attributes and their types (their field names are unique across sections)."""


@dataclass(frozen=True)
class SyncOptions:
    """The options of one stage's gradient synchronisation: the optimizer, the run's steps and the sections.

    exchange: the DP exchange (ExchangeOptions: codec, error feedback, hierarchical).
    optimizer: "adamw" or "onebit-adam" (1-bit Adam does its own DP communication: codec none).
    lr: the optimizer's learning rate (the schedule's peak; set per step with GradientSync.set_lr).
    total_steps: the run's steps (an outer period also ends at the last step).
    onebit_warmup_steps: 1-bit Adam's full-precision warm-up, in steps (onebit-adam only).
    clip_grad_norm: the global gradient norm clip (None: no clipping; not with sync_every).
    outer, streaming, heterogeneity: OuterOptions, StreamingOptions, HeterogeneityOptions (defaults: none of
        them in use, every step's gradients exchanged).
    """

    exchange: ExchangeOptions
    optimizer: str
    lr: float
    total_steps: int
    onebit_warmup_steps: int | None = None
    clip_grad_norm: float | None = None
    outer: OuterOptions = field(default_factory=OuterOptions)
    streaming: StreamingOptions = field(default_factory=StreamingOptions)
    heterogeneity: HeterogeneityOptions = field(default_factory=HeterogeneityOptions)

    @classmethod
    def of(cls, *, codec: Any, optimizer: str, lr: float, total_steps: int, **settings: Any) -> SyncOptions:
        """Options from flat names: `codec` and each section field by its own name (sync_every=4, fragments=2,
        delay=1, ...), the rest defaulted. SyncError for a name no section has."""
        top = {name: settings.pop(name) for name in ("onebit_warmup_steps", "clip_grad_norm") if name in settings}
        sections = {}
        for attribute, section in SECTIONS.items():
            own = {f.name: settings.pop(f.name) for f in fields(section) if f.name in settings}
            sections[attribute] = section(codec, **own) if section is ExchangeOptions else section(**own)
        if settings:
            raise SyncError(f"SyncOptions.of: unknown option(s) {', '.join(sorted(settings))}")
        return cls(optimizer=optimizer, lr=lr, total_steps=total_steps, **top, **sections)

    def __post_init__(self) -> None:
        for attribute, section in SECTIONS.items():
            if not isinstance(getattr(self, attribute), section):
                raise SyncError(f"SyncOptions.{attribute} must be an instance of {section.__name__}, got "
                                f"{getattr(self, attribute)!r}")
        if self.optimizer not in RUNTIME_OPTIMIZERS:
            raise SyncError(f"SyncOptions.optimizer must be one of {', '.join(RUNTIME_OPTIMIZERS)}, "
                            f"got {self.optimizer!r}")
        _positive("lr", self.lr)
        if not _integer(self.total_steps) or self.total_steps < 1:
            raise SyncError(f"SyncOptions.total_steps must be an integer >= 1, got {self.total_steps!r}")
        if self.clip_grad_norm is not None:
            _positive("clip_grad_norm", self.clip_grad_norm)
        self._check_optimizer()
        self._check_moments()
        if self.outer.sync_every is None:
            self._check_per_step()
        else:
            self._check_outer()

    def _check_optimizer(self) -> None:
        exchange = self.exchange
        if self.optimizer == "onebit-adam":
            if not exchange.codec.is_uncompressed:
                raise SyncError(f"SyncOptions: optimizer onebit-adam does its own data-parallel communication; "
                                f"codec must be none, got {str(exchange.codec)!r}", ("optimizer", "exchange.codec"))
            if self.onebit_warmup_steps is None:
                raise SyncError("SyncOptions: optimizer onebit-adam needs onebit_warmup_steps (an integer >= 1)",
                                ("optimizer", "onebit_warmup_steps"))
        if exchange.hierarchical and not reducer_traits(exchange.codec).hierarchical:
            raise SyncError(f"SyncOptions: hierarchical takes a codec of geotrain.codecs; {exchange.codec.name} is "
                            f"its own exchange", ("exchange.hierarchical", "exchange.codec"))

    def _check_moments(self) -> None:
        if not self.outer.sync_moments:
            return
        if self.outer.sync_every is None:
            raise SyncError("SyncOptions: sync_moments averages the inner optimizer's moments at each outer sync: "
                            "it needs sync_every", ("outer.sync_moments", "outer.sync_every"))
        if not reducer_traits(self.exchange.codec).hierarchical:
            raise SyncError(f"SyncOptions: sync_moments sends the moments beside the outer gradients through a codec "
                            f"of geotrain.codecs; {self.exchange.codec.name} is its own exchange",
                            ("outer.sync_moments", "exchange.codec"))

    def _check_per_step(self) -> None:
        """No sync_every: the streaming and heterogeneity settings but the delay are refused; a delay is delayed
        gradients (every step's gradients applied `delay` steps later, geotrain.sync.delayed)."""
        streaming = self.streaming
        if not streaming.is_blocking_diloco:
            raise SyncError(f"SyncOptions: fragments {streaming.fragments!r}, fragment_split "
                            f"{streaming.fragment_split!r}, mix {streaming.mix!r}, landing {streaming.landing!r} and "
                            f"warmup {streaming.warmup!r} are Streaming DiLoCo's: they need sync_every",
                            ("streaming.fragments", "streaming.fragment_split", "streaming.mix", "streaming.landing",
                             "streaming.warmup", "outer.sync_every"))
        if self.heterogeneity.local_steps != "equal":
            raise SyncError(f"SyncOptions: local_steps {self.heterogeneity.local_steps!r} shares an outer period's "
                            f"inner steps: it needs sync_every", ("heterogeneity.local_steps", "outer.sync_every"))
        if not 0 <= streaming.delay < self.total_steps:
            raise SyncError(f"StreamingOptions.delay (steps between a gradient and its update) must be an integer in "
                            f"0..{self.total_steps - 1} (below total_steps), got {streaming.delay!r}",
                            ("streaming.delay",))
        if streaming.delay > 0 and self.optimizer != "adamw":
            raise SyncError(f"SyncOptions: delay {streaming.delay} (delayed gradients) steps AdamW on the landed "
                            f"mean; {self.optimizer} does its own exchange: use delay 0",
                            ("streaming.delay", "optimizer"))
        self._check_overlap()

    def _check_outer(self) -> None:
        """sync_every H: AdamW inside each replica, Streaming DiLoCo's bounds, adaptive local steps."""
        h, streaming = self.outer.sync_every, self.streaming
        if self.optimizer != "adamw":
            raise SyncError(f"SyncOptions: sync_every (local SGD) runs AdamW inside each replica; optimizer "
                            f"must be adamw, got {self.optimizer!r}", ("outer.sync_every", "optimizer"))
        for name, value, low, high in (("fragments", streaming.fragments, 1, h), ("delay", streaming.delay, 0, h - 1)):
            if not low <= value <= high:  # type: ignore[operator]
                raise SyncError(f"StreamingOptions.{name} must be an integer in {low}..{high} (sync_every {h}), "
                                f"got {value!r}")
        self._check_overlap()
        try:
            check_adaptive_settings(self.heterogeneity.local_steps, fragments=streaming.fragments,
                                    who="SyncOptions: local_steps")
        except SyncError as exc:
            raise SyncError(str(exc), ("heterogeneity.local_steps",)) from None
        if self.clip_grad_norm is not None:
            raise SyncError(f"SyncOptions: sync_every (local SGD): replicas do not exchange gradients, so the "
                            f"global clip_grad_norm {self.clip_grad_norm!r} cannot be computed; leave it unset",
                            ("outer.sync_every", "clip_grad_norm"))

    def _check_overlap(self) -> None:
        delay, exchange = self.streaming.delay, self.exchange
        if delay > 0 and not reducer_traits(exchange.codec).hierarchical:
            raise SyncError(f"SyncOptions: delay {delay} overlaps the exchange, which only a codec of "
                            f"geotrain.codecs can (codec {str(exchange.codec)!r}); use delay 0",
                            ("streaming.delay", "exchange.codec"))


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _booleans(options: Any, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(options, name), bool):
            raise SyncError(f"{type(options).__name__}.{name} must be true or false, got {getattr(options, name)!r}")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise SyncError(f"SyncOptions.{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class DPGroup:
    """One stage's data-parallel group as this rank sees it: the process group, its members' global
    ranks and devices (same order), its region hierarchy (None: flat) and its members' links (None:
    unknown; given, a gathered codec's exchange takes the faster algorithm, geotrain.comm.gather)."""

    handle: Any
    ranks: tuple[int, ...]
    devices: tuple[int, ...]
    hierarchy: HierarchicalGroups | None = None
    links: GatherLinks | None = None
    replica_group: Any = None
    """The process group of this rank's whole replica when it is more than one rank (its S stages and K shards),
    where adaptive local steps' step times are agreed first, so that every rank of a replica takes the same inner
    steps (geotrain.sync.sharded.site_agreed: the largest, the slowest stage or shard paces the replica); None:
    one rank per replica."""

    def __post_init__(self) -> None:
        if len(self.ranks) != len(self.devices):
            raise SyncError(f"DPGroup: {len(self.ranks)} ranks but {len(self.devices)} devices")

    def devices_of(self, ranks: tuple[int, ...]) -> list[int]:
        """The devices of `ranks` (members of this group)."""
        device = dict(zip(self.ranks, self.devices, strict=True))
        return [device[r] for r in ranks]
