"""Reducers by spec: `get_reducer("topk:fraction=0.01", context)`, `get_reducer("powersgd:rank=4", context)`.

Specs are codec specs (a `geotrain.codecs.CodecSpec`, or its text, parsed by the one parser). A spec
whose name is in `REDUCERS` builds that reducer from its parameters; any other name is a codec of
geotrain.codecs, run by the codec reducer (error feedback, compressed all-reduce or all-gather). A
Codec instance is taken as it is (its own registered reducer, e.g. powersgd, gets the instance's
parameters).

`reducer_traits(spec)`: what planners and the runtime ask of a reducer without building one (its
payloads all-gathered or summed, latency rounds, whether it can stand between the regions of the
hierarchical all-reduce). Nobody outside codecs/ and comm/ decides these by a codec's name.

To add a reducer: write a factory `(params, context) -> Reducer` and add one `RegisteredReducer`
line (factory and traits) to REDUCERS.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from geotrain.codecs import Codec, CodecError, CodecSpec, PowerSGDCodec, get_codec
from geotrain.comm.codec_reducer import CodecReducer
from geotrain.comm.onebit import OneBitMomentumReducer
from geotrain.comm.powersgd import PowerSGDConfig, PowerSGDLayout, PowerSGDReducer


@dataclass(frozen=True)
class ReducerContext:
    """What every reducer is built for.

    named_shapes: the tensors it averages, (name, shape) in one fixed order (the same on every rank).
    world_size: workers of the group; local_workers: how many of them this process holds (1 in a
        real process group, all of them in the in-process simulation).
    error_feedback: keep residuals of what compression dropped (reducers that compress).
    granularity: the codec reducer's "tensor" (encode each tensor alone) or "flat" (all as one).
    extra: settings only some reducers read (e.g. a hierarchical reducer's regions; the codec reducer's
        "gather_links", geotrain.comm.gather.GatherLinks of the group).
    """

    named_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    world_size: int
    local_workers: int = 1
    error_feedback: bool = True
    granularity: str = "flat"
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, named_shapes: Sequence[tuple[str, Sequence[int]]], world_size: int, **options: Any) -> ReducerContext:
        shapes = tuple((str(name), tuple(int(d) for d in shape)) for name, shape in named_shapes)
        return cls(shapes, world_size, **options)


ReducerFactory = Callable[[dict[str, Any], ReducerContext], Any]


def _powersgd(params: dict[str, Any], context: ReducerContext) -> PowerSGDReducer:
    """Distributed PowerSGD; params are PowerSGDConfig fields (error_feedback defaults to the context's)."""
    allowed = [f.name for f in fields(PowerSGDConfig)]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise CodecError(f"powersgd has no parameter(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})")
    config = PowerSGDConfig(**{"error_feedback": context.error_feedback, **params})
    layout = PowerSGDLayout.build(context.named_shapes, config)
    return PowerSGDReducer(layout, config, context.world_size, context.local_workers)


def _onebit(params: dict[str, Any], context: ReducerContext) -> OneBitMomentumReducer:
    if params:
        raise CodecError(f"onebit has no parameters, got {sorted(params)}")
    numels = [math.prod(shape) for _, shape in context.named_shapes]
    return OneBitMomentumReducer(numels, context.world_size, context.local_workers)


def _codec(codec: Codec, context: ReducerContext) -> CodecReducer:
    return CodecReducer(codec, context.named_shapes, context.world_size, context.local_workers,
                        context.error_feedback, context.granularity, context.extra.get("gather_links"))


@dataclass(frozen=True)
class ReducerTraits:
    """What a reducer's exchange costs and where it may run, known without building it.

    gathered: every member receives every other member's whole payload (an all-gather: (n - 1) b
        bytes per member, in half an all-reduce's latency rounds); False: the payloads are summed on
        the way (an all-reduce or a scatter-reduce).
    latency_rounds: latency rounds of one exchange relative to one all-reduce (PowerSGD: 2, P and Q).
    hierarchical: the hierarchical all-reduce (geotrain.comm.hierarchical) can run it between
        regions: a codec of geotrain.codecs; a reducer with its own exchange (PowerSGD) cannot.
    """

    gathered: bool
    latency_rounds: float = 1.0
    hierarchical: bool = False


@dataclass(frozen=True)
class RegisteredReducer:
    """A reducer other than the codec reducer: its factory and its traits."""

    build: ReducerFactory
    traits: ReducerTraits


REDUCERS: dict[str, RegisteredReducer] = {
    "powersgd": RegisteredReducer(_powersgd, ReducerTraits(gathered=False,
                                                           latency_rounds=PowerSGDCodec.latency_rounds)),
    "onebit": RegisteredReducer(_onebit, ReducerTraits(gathered=False)),
}
"""Reducers other than the codec reducer, by spec name."""


def codec_traits(codec: Codec) -> ReducerTraits:
    """The codec reducer's traits for `codec`: summable codecs all-reduce, the others all-gather."""
    return ReducerTraits(gathered=not codec.summable, latency_rounds=codec.latency_rounds, hierarchical=True)


def reducer_traits(spec: CodecSpec | str) -> ReducerTraits:
    """The traits of the reducer `spec` names (see ReducerTraits); CodecError for an unknown name."""
    spec = CodecSpec.parse(spec)
    if spec.name in REDUCERS:
        return REDUCERS[spec.name].traits
    return codec_traits(get_codec(spec.name))


def get_reducer(spec: str | CodecSpec | Codec, context: ReducerContext, **more_params: Any) -> Any:
    """The reducer `spec` names, built for `context`; `more_params` add to the spec's parameters.
    CodecError names the spec and what is wrong."""
    if isinstance(spec, Codec):
        if more_params:
            raise CodecError(f"parameters {sorted(more_params)} given with a Codec instance; pass a name instead")
        if spec.name in REDUCERS:
            return REDUCERS[spec.name].build(spec.params(), context)
        return _codec(spec, context)
    parsed = CodecSpec.parse(spec)
    params = parsed.kwargs()
    twice = sorted(set(params) & set(more_params))
    if twice:
        raise CodecError(f"codec {str(spec)!r}: parameter(s) {twice} given twice")
    params.update(more_params)
    if parsed.name in REDUCERS:
        return REDUCERS[parsed.name].build(params, context)
    try:
        return _codec(get_codec(parsed.name, **params), context)
    except TypeError as exc:
        raise CodecError(f"codec {str(spec)!r}: {exc}") from None


def check_reducer_spec(spec: str | CodecSpec) -> None:
    """Build `spec`'s reducer for a one-tensor group: CodecError if its name or parameters are wrong."""
    get_reducer(spec, ReducerContext.of([("check", (4, 4))], 1))
