"""What picks and configures a gradient sync: `SyncOptions` (typed, checked where built) and the DP
group it runs on (`DPGroup`). Each bad value or combination is refused in one line naming it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from geotrain.codecs import CodecError, CodecSpec
from geotrain.comm import check_reducer_spec, reducer_traits
from geotrain.comm.gather import GatherLinks
from geotrain.comm.hierarchical import HierarchicalGroups
from geotrain.optim.outer import DILOCO_LR, DILOCO_MOMENTUM, LANDINGS, OuterStepError, check_outer_settings
from geotrain.optim.registry import RUNTIME_OPTIMIZERS
from geotrain.sync.adaptive import check_adaptive_settings
from geotrain.sync.base import SyncError
from geotrain.sync.streaming import FRAGMENT_SPLITS


@dataclass(frozen=True)
class SyncOptions:
    """The options of one stage's gradient synchronisation.

    codec: the DP exchange's codec / reducer spec (a string is parsed once, here).
    error_feedback: keep the residuals of what the codec dropped.
    optimizer: "adamw" or "onebit-adam" (1-bit Adam does its own DP communication: codec none).
    lr: the optimizer's learning rate (the schedule's peak; set per step with GradientSync.set_lr).
    total_steps: the run's steps (an outer period also ends at the last step).
    onebit_warmup_steps: 1-bit Adam's full-precision warm-up, in steps (onebit-adam only).
    clip_grad_norm: the global gradient norm clip (None: no clipping; not with sync_every).
    sync_every: H, the local-SGD / DiLoCo outer period in steps (None: every step's gradients).
    delay: tau, steps an exchange travels while compute goes on: without sync_every every step's gradients
        are applied tau steps after they were computed (geotrain.sync.delayed; 0: blocking, PerStepSync);
        with it, Streaming DiLoCo's delay (below).
    outer_lr, outer_momentum: the outer Nesterov SGD's (sync_every only).
    hierarchical: full precision inside regions, the codec between them (geotrain.comm.hierarchical).
    fragments, delay, mix: Streaming DiLoCo (sync_every; geotrain.sync.streaming): P fragments
        synced at staggered offsets, each landing `delay` steps after it starts, mixed in with `mix`.
    fragment_split: how the fragments are cut (geotrain.sync.streaming.FRAGMENT_SPLITS): "layers" between
        tensors, "bytes" at equal bytes (splitting the tensors the cuts fall in).
    landing: how a late sync lands (geotrain.optim.outer.LANDINGS): "mix" (with `mix`) or "eager" (the local
        outer gradient applied at the start as the mean's proxy, the correction when the mean lands).
    warmup: syncs started before this step block (tau 0): the overlap starts after the outer warm-up.
    sync_moments: each outer sync also averages the inner AdamW's moments (geotrain.sync.moments).
    local_steps: "equal" (H inner steps per outer period on every replica) or "adaptive" (H_r by measured
        speed, the outer mean weighted by steps: geotrain.sync.adaptive; one fragment, flat DiLoCo only).
    local_steps_prior_s: adaptive: relative seconds per step of each DP member (group order) before any is
        measured, which share out the first period (None: H each).
    moment_syncs: with sync_moments, only each fragment's first `moment_syncs` outer syncs carry the moments;
        the later ones send the outer gradients alone (None: every sync).
    outer_sync: "sync", or "async" / "async-hierarchical" (sync_every; geotrain.sync.async_outer).
    """

    codec: CodecSpec
    optimizer: str
    lr: float
    total_steps: int
    error_feedback: bool = True
    onebit_warmup_steps: int | None = None
    clip_grad_norm: float | None = None
    sync_every: int | None = None
    outer_lr: float = DILOCO_LR
    outer_momentum: float = DILOCO_MOMENTUM
    hierarchical: bool = False
    fragments: int = 1
    fragment_split: str = "layers"
    delay: int = 0
    mix: float = 0.0
    landing: str = "mix"
    warmup: int = 0
    sync_moments: bool = False
    moment_syncs: int | None = None
    local_steps: str = "equal"
    local_steps_prior_s: tuple[float, ...] | None = None
    outer_sync: str = "sync"

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "codec", CodecSpec.parse(self.codec))
            check_reducer_spec(self.codec)
        except CodecError as exc:
            raise SyncError(f"SyncOptions.codec {str(self.codec)!r}: {exc}") from None
        if self.optimizer not in RUNTIME_OPTIMIZERS:
            raise SyncError(f"SyncOptions.optimizer must be one of {', '.join(RUNTIME_OPTIMIZERS)}, "
                            f"got {self.optimizer!r}")
        _positive("lr", self.lr)
        if isinstance(self.total_steps, bool) or not isinstance(self.total_steps, int) or self.total_steps < 1:
            raise SyncError(f"SyncOptions.total_steps must be an integer >= 1, got {self.total_steps!r}")
        for name in ("error_feedback", "hierarchical", "sync_moments"):
            if not isinstance(getattr(self, name), bool):
                raise SyncError(f"SyncOptions.{name} must be true or false, got {getattr(self, name)!r}")
        if self.clip_grad_norm is not None:
            _positive("clip_grad_norm", self.clip_grad_norm)
        self._check_combinations()

    def _check_combinations(self) -> None:
        if self.optimizer == "onebit-adam":
            if not self.codec.is_uncompressed:
                raise SyncError(f"SyncOptions: optimizer onebit-adam does its own data-parallel communication; "
                                f"codec must be none, got {str(self.codec)!r}", ("optimizer", "codec"))
            if self.hierarchical:
                raise SyncError("SyncOptions: hierarchical with onebit-adam is not supported (1-bit Adam between "
                                "regions is geotrain.optim.RegionOneBitAdam, for DDP scripts)", ("hierarchical", "optimizer"))
            if self.onebit_warmup_steps is None:
                raise SyncError("SyncOptions: optimizer onebit-adam needs onebit_warmup_steps (an integer >= 1)",
                                ("optimizer", "onebit_warmup_steps"))
        if self.hierarchical and not reducer_traits(self.codec).hierarchical:
            raise SyncError(f"SyncOptions: hierarchical takes a codec of geotrain.codecs; {self.codec.name} is "
                            f"its own exchange", ("hierarchical", "codec"))
        streaming = (self.fragments, self.fragment_split, self.mix, self.landing, self.warmup)
        if self.sync_every is None and streaming != (1, "layers", 0.0, "mix", 0):
            raise SyncError(f"SyncOptions: fragments {self.fragments!r}, fragment_split {self.fragment_split!r}, mix "
                            f"{self.mix!r}, landing {self.landing!r} and warmup {self.warmup!r} are Streaming "
                            f"DiLoCo's: they need sync_every",
                            ("fragments", "fragment_split", "mix", "landing", "warmup", "sync_every"))
        if self.moment_syncs is not None:
            if isinstance(self.moment_syncs, bool) or not isinstance(self.moment_syncs, int) or self.moment_syncs < 1:
                raise SyncError(f"SyncOptions.moment_syncs must be an integer >= 1 (None: every outer sync), got "
                                f"{self.moment_syncs!r}")
            if not self.sync_moments:
                raise SyncError("SyncOptions: moment_syncs says how many outer syncs carry the moments: it needs "
                                "sync_moments", ("moment_syncs", "sync_moments"))
        if self.local_steps != "equal" and self.sync_every is None:
            raise SyncError(f"SyncOptions: local_steps {self.local_steps!r} shares an outer period's inner steps: it "
                            f"needs sync_every", ("local_steps", "sync_every"))
        if self.sync_moments and self.sync_every is None:
            raise SyncError("SyncOptions: sync_moments averages the inner optimizer's moments at each outer sync: "
                            "it needs sync_every", ("sync_moments", "sync_every"))
        if self.sync_moments and self.hierarchical:
            raise SyncError("SyncOptions: sync_moments with hierarchical is not supported (the moments travel in "
                            "the flat exchange's collective)", ("sync_moments", "hierarchical"))
        if self.sync_moments and not reducer_traits(self.codec).hierarchical:
            raise SyncError(f"SyncOptions: sync_moments sends the moments beside the outer gradients through a codec "
                            f"of geotrain.codecs; {self.codec.name} is its own exchange", ("sync_moments", "codec"))
        if self.sync_every is None:
            self._check_delayed_gradients()
        if self.sync_every is not None:
            try:
                check_outer_settings(self.sync_every, self.outer_lr, self.outer_momentum, "SyncOptions")
            except OuterStepError as exc:
                raise SyncError(str(exc)) from None
            if self.optimizer != "adamw":
                raise SyncError(f"SyncOptions: sync_every (local SGD) runs AdamW inside each replica; optimizer "
                                f"must be adamw, got {self.optimizer!r}", ("sync_every", "optimizer"))
            self._check_streaming()
            try:
                check_adaptive_settings(self.local_steps, fragments=self.fragments,
                                        sync_moments=self.sync_moments, hierarchical=self.hierarchical,
                                        who="SyncOptions: local_steps")
            except SyncError as exc:
                raise SyncError(str(exc), ("local_steps",)) from None
            if self.clip_grad_norm is not None:
                raise SyncError(f"SyncOptions: sync_every (local SGD): replicas do not exchange gradients, so the "
                                f"global clip_grad_norm {self.clip_grad_norm!r} cannot be computed; leave it unset",
                                ("sync_every", "clip_grad_norm"))


    def _check_streaming(self) -> None:
        h = self.sync_every
        for name, value, low, high in (("fragments", self.fragments, 1, h), ("delay", self.delay, 0, h - 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise SyncError(f"SyncOptions.{name} must be an integer in {low}..{high} (sync_every {h}), "
                                f"got {value!r}")
        if isinstance(self.mix, bool) or not isinstance(self.mix, int | float) or not 0.0 <= self.mix <= 1.0:
            raise SyncError(f"SyncOptions.mix must be a number in [0, 1], got {self.mix!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise SyncError(f"SyncOptions.warmup must be an integer >= 0, got {self.warmup!r}")
        if self.fragment_split not in FRAGMENT_SPLITS:
            raise SyncError(f"SyncOptions.fragment_split must be one of {', '.join(FRAGMENT_SPLITS)}, got "
                            f"{self.fragment_split!r}")
        if self.landing not in LANDINGS:
            raise SyncError(f"SyncOptions.landing must be one of {', '.join(LANDINGS)}, got {self.landing!r}")
        if self.landing == "eager" and self.mix != 0:
            raise SyncError(f"SyncOptions: mix {self.mix!r} is the mix landing's alpha; eager landing keeps the local "
                            f"progress itself: leave mix 0", ("landing", "mix"))
        self._check_overlap()

    def _check_delayed_gradients(self) -> None:
        """delay without sync_every: every step's gradients applied `delay` steps later (geotrain.sync.delayed)."""
        if isinstance(self.delay, bool) or not isinstance(self.delay, int) or not 0 <= self.delay < self.total_steps:
            raise SyncError(f"SyncOptions.delay (steps between a gradient and its update) must be an integer in "
                            f"0..{self.total_steps - 1} (below total_steps), got {self.delay!r}", ("delay",))
        if self.delay > 0 and self.optimizer != "adamw":
            raise SyncError(f"SyncOptions: delay {self.delay} (delayed gradients) steps AdamW on the landed mean; "
                            f"{self.optimizer} does its own exchange: use delay 0", ("delay", "optimizer"))
        self._check_overlap()

    def _check_overlap(self) -> None:
        if self.delay > 0 and (self.hierarchical or not reducer_traits(self.codec).hierarchical):
            raise SyncError(f"SyncOptions: delay {self.delay} overlaps the exchange, which only a flat codec "
                            f"reducer can (codec {str(self.codec)!r}, hierarchical {self.hierarchical}); use delay 0",
                            ("delay", "codec", "hierarchical"))


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

    def __post_init__(self) -> None:
        if len(self.ranks) != len(self.devices):
            raise SyncError(f"DPGroup: {len(self.ranks)} ranks but {len(self.devices)} devices")

    def devices_of(self, ranks: tuple[int, ...]) -> list[int]:
        """The devices of `ranks` (members of this group)."""
        device = dict(zip(self.ranks, self.devices, strict=True))
        return [device[r] for r in ranks]
