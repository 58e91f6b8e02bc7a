"""Reducers by spec: `get_reducer("topk:fraction=0.01", context)`, `get_reducer("powersgd:rank=4", context)`.

Specs are codec specs (geotrain.codecs.parse_codec_spec, the one parser). A spec whose name is in
`REDUCERS` builds that reducer from its parameters; any other name is a codec of geotrain.codecs,
run by the codec reducer (error feedback, compressed all-reduce or all-gather). A Codec instance is
taken as it is (its own registered reducer, e.g. powersgd, gets the instance's parameters).

To add a reducer: write a factory `(params, context) -> Reducer` and add one line to REDUCERS.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from geotrain.codecs import Codec, CodecError, get_codec, parse_codec_spec
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
    extra: settings only some reducers read (e.g. a hierarchical reducer's regions).
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
                        context.error_feedback, context.granularity)


REDUCERS: dict[str, ReducerFactory] = {
    "powersgd": _powersgd,
    "onebit": _onebit,
}
"""Reducers other than the codec reducer, by spec name."""


def get_reducer(spec: str | Codec, context: ReducerContext, **more_params: Any) -> Any:
    """The reducer `spec` names, built for `context`; `more_params` add to the spec's parameters.
    CodecError names the spec and what is wrong."""
    if isinstance(spec, Codec):
        if more_params:
            raise CodecError(f"parameters {sorted(more_params)} given with a Codec instance; pass a name instead")
        if spec.name in REDUCERS:
            return REDUCERS[spec.name](spec.params(), context)
        return _codec(spec, context)
    name, params = parse_codec_spec(spec)
    twice = sorted(set(params) & set(more_params))
    if twice:
        raise CodecError(f"codec {spec!r}: parameter(s) {twice} given twice")
    params.update(more_params)
    if name in REDUCERS:
        return REDUCERS[name](params, context)
    try:
        return _codec(get_codec(name, **params), context)
    except TypeError as exc:
        raise CodecError(f"codec {spec!r}: {exc}") from None


def check_reducer_spec(spec: str) -> None:
    """Build `spec`'s reducer for a one-tensor group: CodecError if its name or parameters are wrong."""
    get_reducer(spec, ReducerContext.of([("check", (4, 4))], 1))
