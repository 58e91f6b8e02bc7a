"""Which `geotrain train` settings combine: one table of data that the config validation and the docs read.

`SETTINGS` are the levers a user combines (each with the flags that turn it on, the settings it needs, and
how a RuntimeConfig shows it); `RULES` are the pairs that do not run together, each with its reason. A rule
is `built=False` where the pair is not yet built (a later change can lift it) and `built=True` where the
reason holds by design. `composition_refusal(config)` is the one line of the first rule whose two settings
`config` uses (RuntimeConfig runs it before its other cross-section checks); `pair_refusal(a, b)` is the rule
that refuses a cell of the table (a setting brings the settings it needs: `--fragments 2` is DiLoCo's), which
the docs' page "Composition" (geotrain.cli.reference.composition_markdown) lists for every pair.

Conditions that are not a pair of these levers (values and ranges, a setting and the plan's shape with a
third setting, e.g. elastic groups of S > 1 stages on emulated links) stay with the section or rule module
that owns them (runtime/sections.py, runtime/elastic/rules.py, geotrain.sync.options).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any


@dataclass(frozen=True)
class Setting:
    """A lever of `geotrain train`. name: its id in RULES; flags: what a user writes; needs: the settings it
    comes with (ids); on(config): whether a RuntimeConfig uses it; shown(config): the flag with the config's
    value, for a refusal; values: the RuntimeConfig.of keys that turn it on (the table's walk, with its needs'
    values; "shards": K devices per slot, which the walk lays out on its cluster); stages: the plan's pipeline
    stages it needs (1: any)."""

    name: str
    flags: str
    on: Callable[[Any], bool]
    shown: Callable[[Any], str]
    values: dict[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    stages: int = 1


@dataclass(frozen=True)
class Rule:
    """Settings `first` and `second` (ids) do not run together: `reason` why, `built` False where the pair is
    not built yet (a later change can lift it), True where the reason holds by design; `instead`: what runs."""

    first: str
    second: str
    reason: str
    built: bool = False
    instead: str = ""

    def line(self, config: Any) -> str:
        """The one-line refusal for `config` (which uses both settings)."""
        first, second = SETTING[self.first].shown(config), SETTING[self.second].shown(config)
        why = self.reason if self.built else f"not built yet: {self.reason}"
        return f"{first} with {second}: {why}" + (f"; {self.instead}" if self.instead else "")


def _codec(config: Any) -> str:
    return f"--dp-codec {config.comm.dp_codec}"


SETTINGS: tuple[Setting, ...] = (
    Setting("pipeline", "a plan of S > 1 stages", lambda c: c.pipeline_stages > 1,
            lambda c: f"a plan of {c.pipeline_stages} pipeline stages", stages=2),
    Setting("diloco", "--sync-every H", lambda c: c.optim.sync_every is not None,
            lambda c: f"--sync-every {c.optim.sync_every}", {"sync_every": 4}),
    Setting("fragments", "--fragments P", lambda c: c.optim.fragments > 1,
            lambda c: f"--fragments {c.optim.fragments}", {"fragments": 2}, ("diloco",)),
    Setting("delay", "--sync-delay TAU", lambda c: c.optim.sync_delay > 0,
            lambda c: f"--sync-delay {c.optim.sync_delay}", {"sync_delay": 1}, ("diloco",)),
    Setting("moments", "--sync-moments", lambda c: c.optim.sync_moments, lambda c: "--sync-moments",
            {"sync_moments": True}, ("diloco",)),
    Setting("adaptive", "--local-steps adaptive", lambda c: c.optim.local_steps == "adaptive",
            lambda c: "--local-steps adaptive", {"local_steps": "adaptive"}, ("diloco",)),
    Setting("async", "--outer-sync async", lambda c: c.optim.outer_sync == "async",
            lambda c: "--outer-sync async", {"outer_sync": "async"}, ("diloco",)),
    Setting("async-hierarchical", "--outer-sync async-hierarchical",
            lambda c: c.optim.outer_sync == "async-hierarchical", lambda c: "--outer-sync async-hierarchical",
            {"outer_sync": "async-hierarchical"}, ("diloco",)),
    Setting("codec", "--dp-codec CODEC", lambda c: not c.comm.dp_codec.is_uncompressed, _codec,
            {"dp_codec": "int8-block"}),
    Setting("plan-codecs", "a plan's codecs (plan --codecs auto, --wan-recipe)", lambda c: bool(c.comm.dp_codecs),
            lambda c: f"the plan's codecs {[str(s) for s in c.comm.dp_codecs]}", {"dp_codecs": "int8-block"}),
    Setting("hierarchical", "--dp-hierarchical", lambda c: c.comm.dp_hierarchical, lambda c: "--dp-hierarchical",
            {"dp_hierarchical": True}),
    Setting("onebit", "--optimizer onebit-adam", lambda c: c.optim.optimizer == "onebit-adam",
            lambda c: "--optimizer onebit-adam", {"optimizer": "onebit-adam"}),
    Setting("clip", "--clip-grad-norm X", lambda c: c.optim.clip_grad_norm is not None,
            lambda c: f"--clip-grad-norm {c.optim.clip_grad_norm:g}", {"clip_grad_norm": 1.0}),
    Setting("batch-shares", "--batch-shares speed|W1,...", lambda c: c.schedule.batch_shares != "equal",
            lambda c: f"--batch-shares {c.schedule.batch_shares}", {"batch_shares": "speed"}),
    Setting("eval-local", "--eval-local", lambda c: c.data.eval_local, lambda c: "--eval-local",
            {"eval_local": True}),
    Setting("checkpoint-every", "--checkpoint-every K", lambda c: c.checkpoint.checkpoint_every > 0,
            lambda c: f"--checkpoint-every {c.checkpoint.checkpoint_every}", {"checkpoint_every": 2}),
    Setting("resume", "--resume", lambda c: c.checkpoint.resume, lambda c: "--resume", {"resume": True}),
    Setting("stop-after", "--stop-after K", lambda c: c.run.stop_after is not None,
            lambda c: f"--stop-after {c.run.stop_after}", {"stop_after": 2}),
    Setting("elastic", "--elastic", lambda c: c.reliability.elastic, lambda c: "--elastic", {"elastic": True}),
    Setting("links", "--time-scale F > 0 (emulated links)", lambda c: c.emulation.time_scale > 0,
            lambda c: f"--time-scale {c.emulation.time_scale:g}", {"time_scale": 1.0}),
    Setting("cuda", "--device cuda", lambda c: c.run.device == "cuda", lambda c: "--device cuda",
            {"device": "cuda"}),
    Setting("shards", "a plan of K > 1 devices per slot (plan --shards K)", lambda c: c.layout.k > 1,
            lambda c: f"a plan of {c.layout.k} devices per slot (plan --shards)", {"shards": 2}, ("diloco",)),
)
"""The levers of the composition table, in its order. The walk's base: --time-scale 0, checkpoints in a
directory, a cluster of known GPU types."""

SETTING = {setting.name: setting for setting in SETTINGS}

_ASYNC_PACE = ("asynchronous outer updates send a replica's outer gradient (per stage, shard and fragment) at its own "
                "pace")

RULES: tuple[Rule, ...] = (
    # the optimizer and the outer step
    Rule("onebit", "diloco", "local SGD runs AdamW inside each replica", built=True, instead="use --optimizer adamw"),
    Rule("clip", "diloco", "replicas do not exchange gradients, so the global gradient norm cannot be computed",
         built=True, instead="leave --clip-grad-norm unset"),
    Rule("onebit", "codec", "1-bit Adam does its own data-parallel communication", built=True,
         instead="use --dp-codec none"),
    Rule("onebit", "plan-codecs", "1-bit Adam does its own data-parallel communication", built=True,
         instead="plan without --codecs / --wan-recipe"),
    Rule("onebit", "delay", "delayed gradients step AdamW on the landed mean; 1-bit Adam does its own exchange",
         built=True),
    Rule("batch-shares", "diloco", "shares of the batch balance per-step data parallelism; with --sync-every the "
         "replicas' shares of work are --local-steps adaptive", built=True, instead="use --batch-shares equal"),
    # streaming DiLoCo, moments, regions
    # adaptive local steps
    Rule("adaptive", "fragments", "fragments sync at fixed step offsets, which per-replica step counts break",
         built=True),
    # asynchronous outer updates
    *(rule for mode in ("async", "async-hierarchical") for rule in (
        Rule(mode, "adaptive", f"{_ASYNC_PACE}; adaptive local steps balance a synchronous period", built=True),
        Rule(mode, "delay", f"{_ASYNC_PACE}: a replica never waits for the exchange (no delay to set)", built=True))),
    Rule("async", "hierarchical", "asynchronous updates take their regions from the cluster itself", built=True,
         instead="use --outer-sync async-hierarchical"),
    Rule("async-hierarchical", "hierarchical", "asynchronous updates take their regions from the cluster itself",
         built=True, instead="drop --dp-hierarchical"),
    # the rest
    Rule("eval-local", "pipeline", "a replica scores its own weights on one rank: one pipeline stage only",
         built=True),
    Rule("cuda", "links", "link emulation runs on CPU (gloo) only", built=True,
         instead="pass --time-scale 0 to train over NCCL without emulation"),
)
"""The pairs that do not run together, in the order validation checks them (the first that applies speaks)."""


def composition_refusal(config: Any) -> str | None:
    """The one line of the first rule whose two settings `config` (a RuntimeConfig) uses; None if none."""
    return next((rule.line(config) for rule in RULES
                 if SETTING[rule.first].on(config) and SETTING[rule.second].on(config)), None)


def with_needs(names: tuple[str, ...] | list[str] | set[str]) -> set[str]:
    """`names` and every setting they need."""
    found: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name not in found:
            found.add(name)
            pending.extend(SETTING[name].needs)
    return found


def pair_refusal(first: str, second: str) -> Rule | None:
    """The rule that refuses settings `first` and `second` together (with what they need), or None: it runs."""
    used = with_needs((first, second))
    return next((rule for rule in RULES if {rule.first, rule.second} <= used), None)


def alternatives(first: Setting, second: Setting) -> bool:
    """Whether `first` and `second` are two values of one setting (e.g. --outer-sync async and
    async-hierarchical): not a pair a run can hold."""
    return any(first.values[key] != value for key, value in second.values.items() if key in first.values)


def pairs() -> Iterator[tuple[Setting, Setting]]:
    """Every pair of SETTINGS a run can hold (not `alternatives`), in table order."""
    return ((a, b) for a, b in combinations(SETTINGS, 2) if not alternatives(a, b))


def walk_values(first: Setting, second: Setting) -> tuple[int, dict[str, Any]]:
    """(pipeline stages, RuntimeConfig.of settings) of the table's cell `first` x `second`: both settings with
    what they need (plan codecs: one per stage)."""
    stages = max(first.stages, second.stages)
    values: dict[str, Any] = {}
    for name in sorted(with_needs((first.name, second.name))):
        values.update(SETTING[name].values)
    if "dp_codecs" in values:
        values["dp_codecs"] = (values["dp_codecs"],) * stages
    return stages, values
