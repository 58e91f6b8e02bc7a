"""GroupedCodecReducer: several codecs' payloads in one all-gather; each part's mean is what its own
CodecReducer would deliver, bit for bit, and the call posts exactly one collective."""

from __future__ import annotations

import pytest
import torch

from geotrain.codecs import CodecError, get_codec
from geotrain.comm.codec_reducer import CodecReducer
from geotrain.comm.grouped import GroupedCodecReducer

WORLD = 3
SHAPES = {"a": (40,), "b": (3, 7), "m": (50,), "v": (33,)}


class Posted:
    """A posted all-gather that completes once every simulated rank has posted."""

    def __init__(self, board: list[torch.Tensor]) -> None:
        self.board = board

    def wait(self) -> torch.Tensor:
        assert len(self.board) == WORLD
        return torch.cat(self.board)


class Board:
    """Stand-in collective shared by WORLD simulated ranks: counts the all-gathers each one posts."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []
        self.posts = 0

    def start_all_gather(self, tensors, algorithm="ring"):
        self.posts += 1
        self.buffers.append(tensors[0].clone())
        return Posted(self.buffers)


def _parts(error_feedback_v: bool = False) -> list[CodecReducer]:
    return [CodecReducer(get_codec("int8-block"), [(n, SHAPES[n]) for n in ("a", "b", "m")], WORLD),
            CodecReducer(get_codec("log-block"), [("v", SHAPES["v"])], WORLD, error_feedback=error_feedback_v)]


def _tensors(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    out = [torch.randn(SHAPES[n], generator=g) for n in ("a", "b", "m")]
    return out + [torch.rand(SHAPES["v"], generator=g) ** 6 * 1e-3]


def test_one_collective_and_each_part_as_its_own_reducer_delivers():
    board = Board()
    reducers = [GroupedCodecReducer(_parts()) for _ in range(WORLD)]
    finishes = [r.start([_tensors(rank)], board, step=0) for rank, r in enumerate(reducers)]
    assert board.posts == WORLD  # one all-gather per rank for both codecs
    results = [finish() for finish in finishes]
    for result in results[1:]:
        assert all(torch.equal(x, y) for x, y in zip(results[0], result))
    # the reference: each part through its own reducer, gathered separately
    for index, names in ((0, ("a", "b", "m")), (1, ("v",))):
        own = Board()
        singles = [_parts()[index] for _ in range(WORLD)]
        pieces = [_tensors(rank)[:3] if index == 0 else _tensors(rank)[3:] for rank in range(WORLD)]
        expected = [s.start([piece], own, step=0) for s, piece in zip(singles, pieces)][0]()
        got = results[0][:3] if index == 0 else results[0][3:]
        assert all(torch.equal(x, y) for x, y in zip(got, expected))
    exact_v = sum(t[3] for t in map(_tensors, range(WORLD))) / WORLD
    assert float((results[0][3] / exact_v).log().abs().max()) < 2.0  # log-block: within its relative bound
    assert reducers[0].declared_bytes == (get_codec("int8-block").wire_nbytes((40 + 21 + 50,))
                                          + get_codec("log-block").wire_nbytes((33,)))


def test_a_call_may_send_the_first_parts_alone_and_keeps_the_others_residuals():
    board = Board()
    reducers = [GroupedCodecReducer(_parts(error_feedback_v=True)) for _ in range(WORLD)]
    for rank, r in enumerate(reducers):  # a full call first: every part has residuals
        r.start([_tensors(rank)], board, step=0)
    v_residual = reducers[0].parts[1].residuals[0]["v"].clone()
    declared = reducers[0].declared_bytes
    first = Board()
    finishes = [r.start([_tensors(rank + 5)[:3]], first, step=1, parts=1) for rank, r in enumerate(reducers)]
    results = [finish() for finish in finishes]
    assert first.posts == WORLD and len(results[0]) == 3
    # the first part's means are what its own reducer (with the same residuals) delivers
    own = Board()
    singles = [_parts()[0] for _ in range(WORLD)]
    for rank, single in enumerate(singles):
        single.start([_tensors(rank)[:3]], Board(), step=0)  # the same history: the full call's first part
    expected = [s.start([_tensors(rank + 5)[:3]], own, step=1) for rank, s in enumerate(singles)][0]()
    assert all(torch.equal(x, y) for x, y in zip(results[0], expected))
    assert torch.equal(reducers[0].parts[1].residuals[0]["v"], v_residual)  # the part left out kept its residual
    assert reducers[0].declared_bytes - declared == get_codec("int8-block").wire_nbytes((40 + 21 + 50,))
    with pytest.raises(ValueError, match="parts must be an integer in 1..2"):
        reducers[0].start([_tensors(0)], Board(), step=2, parts=0)
    with pytest.raises(ValueError, match="the first 1 part"):
        reducers[0].start([_tensors(0)], Board(), step=2, parts=1)  # four tensors for a three-tensor part


def test_state_round_trips_and_mismatches_are_refused():
    reducer = GroupedCodecReducer(_parts())
    board = Board()
    for rank in range(WORLD):
        (reducer if rank == 0 else GroupedCodecReducer(_parts())).start([_tensors(rank)], board, step=0)
    state = reducer.state_dict()
    fresh = GroupedCodecReducer(_parts())
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.parts[0].residuals[0][n], reducer.parts[0].residuals[0][n]) for n in ("a", "b", "m"))
    with pytest.raises(CodecError, match="part"):
        GroupedCodecReducer(_parts()[:1]).load_state_dict(state)
    with pytest.raises(CodecError, match="names"):
        GroupedCodecReducer([_parts()[0], _parts()[0]])
    with pytest.raises(ValueError, match="in order"):
        reducer.start([_tensors(0)], Board(), step=0, names=["a"])
