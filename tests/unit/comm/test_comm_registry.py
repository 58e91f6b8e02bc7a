"""Reducer traits (geotrain.comm.reducer_traits): the facts planners ask instead of naming codecs,
held to what the reducers actually do."""

from __future__ import annotations

import pytest
import torch

from geotrain.codecs import CODECS, CodecError, CodecSpec
from geotrain.comm import REDUCERS, ReducerContext, SimulatedCollective, get_reducer, reducer_traits


class CountingCollective(SimulatedCollective):
    """A simulated collective that counts which collectives a reducer called."""

    def __init__(self, world_size: int) -> None:
        super().__init__(world_size)
        self.calls: list[str] = []

    def all_reduce_sum(self, tensors):
        self.calls.append("all_reduce")
        return super().all_reduce_sum(tensors)

    def all_gather(self, tensors):
        self.calls.append("all_gather")
        return super().all_gather(tensors)


@pytest.mark.parametrize("name", [name for name in CODECS if name not in REDUCERS])
def test_gathered_trait_is_what_the_codec_reducer_does(name):
    """Every codec run by the codec reducer: all-gathered exactly when its traits say so."""
    context = ReducerContext.of([("w", (16, 16))], world_size=2, local_workers=2)
    reducer = get_reducer(name, context)
    collective = CountingCollective(2)
    torch.manual_seed(0)
    reducer.reduce([[torch.randn(16, 16)], [torch.randn(16, 16)]], collective, step=0)
    assert collective.calls == (["all_gather"] if reducer_traits(name).gathered else ["all_reduce"])


def test_gathered_codecs_are_int8_int8block_topk_sign():
    gathered = {name for name in CODECS if name not in REDUCERS and reducer_traits(name).gathered}
    assert gathered == {"int8", "int8-block", "topk", "sign", "int4-block", "fp4-block", "int2-block", "topk-lowbit",
                        "log-block", "sign-block", "rotated-sign", "rotated-ternary"}


def test_powersgd_reducer_sums_in_two_rounds_and_cannot_run_between_regions():
    traits = reducer_traits(CodecSpec.parse("powersgd:rank=2"))
    assert (traits.gathered, traits.latency_rounds, traits.hierarchical) == (False, 2.0, False)
    assert reducer_traits("sign").hierarchical and reducer_traits("none").latency_rounds == 1.0


def test_unknown_reducer_is_refused_naming_it():
    with pytest.raises(CodecError, match="unknown codec 'nope'"):
        reducer_traits("nope")


def test_get_reducer_takes_a_codec_spec_like_its_text():
    context = ReducerContext.of([("w", (8, 8))], world_size=1)
    typed = get_reducer(CodecSpec.parse("topk:fraction=0.25"), context)
    text = get_reducer("topk:fraction=0.25", context)
    assert (typed.codec.name, typed.codec.fraction) == (text.codec.name, text.codec.fraction) == ("topk", 0.25)
