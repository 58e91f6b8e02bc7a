"""Fragments cut at equal bytes (geotrain.sync.streaming.split_fragments_by_bytes, fragment_pieces, piece_view):
the pieces cover every row once, in order, each cut at the row boundary nearest k/P of the bytes, a piece's
view writes through to its parameter, and a parameter moved to new memory is refused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.sync import SyncError, SyncOptions
from geotrain.sync.base import ComputeTimer
from geotrain.sync.streaming import (Piece, StreamingOuterSync, fragment_pieces, piece_view,
                                     split_fragments_by_bytes)


@settings(max_examples=300, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=10),
       data=st.data())
def test_byte_split_covers_each_row_once_and_cuts_at_the_nearest_row_boundary(shapes, data):
    rows = [r for r, _ in shapes]
    row_bytes = [4 * c for _, c in shapes]
    fragments = data.draw(st.integers(1, min(12, sum(rows))))
    pieces = split_fragments_by_bytes(rows, row_bytes, fragments)
    assert len(pieces) == fragments and all(fragment for fragment in pieces)
    flat = [(p.index, r) for fragment in pieces for p in fragment for r in range(p.start, p.stop)]
    assert flat == [(i, r) for i, n in enumerate(rows) for r in range(n)]  # every row once, in order
    assert all(p.whole == ((p.start, p.stop) == (0, rows[p.index])) for fragment in pieces for p in fragment)
    total = sum(n * b for n, b in zip(rows, row_bytes))
    n_rows, row_cut, byte_cut = sum(rows), 0, 0
    for k, fragment in enumerate(pieces[:-1], start=1):
        previous = row_cut
        row_cut += sum(p.stop - p.start for p in fragment)
        byte_cut += sum((p.stop - p.start) * row_bytes[p.index] for p in fragment)
        if row_cut not in (previous + 1, n_rows - (fragments - k)):  # not forced to keep fragments non-empty
            assert abs(byte_cut - k * total / fragments) <= max(row_bytes) / 2 + 1e-9


def test_a_dominant_weight_is_split_by_rows_so_every_fragment_is_a_quarter():
    # nn.Linear(512, 512) after a Linear(64, 512): the layer split's largest fragment is the 88% weight
    params = [torch.zeros(512, 64), torch.zeros(512), torch.zeros(512, 512), torch.zeros(512), torch.zeros(1, 512),
              torch.zeros(1)]
    total = sum(p.numel() for p in params)
    layers = fragment_pieces(params, 4, "layers")
    assert max(sum(params[p.index].numel() for p in f) for f in layers) == 512 * 512
    pieces = fragment_pieces(params, 4, "bytes")
    sizes = [sum((p.stop - p.start) * params[p.index][0].numel() for p in f) for f in pieces]
    assert sum(sizes) == total and max(abs(s - total / 4) for s in sizes) <= 512  # two cuts, each within half a row
    assert [[(p.index, p.whole) for p in f] for f in pieces] == [
        [(0, True), (1, True), (2, False)], [(2, False)], [(2, False)], [(2, False), (3, True), (4, True), (5, True)]]


def test_one_fragment_by_bytes_is_the_whole_model_in_whole_tensors():
    params = [torch.zeros(3, 5), torch.zeros(7), torch.zeros(())]
    assert fragment_pieces(params, 1, "bytes") == fragment_pieces(params, 1, "layers") == [
        [Piece(0, 0, 3, True), Piece(1, 0, 7, True), Piece(2, 0, 1, True)]]


def test_a_piece_view_is_its_rows_and_writes_through_to_its_parameter():
    weight = torch.nn.Parameter(torch.arange(12.0).reshape(4, 3))
    view = piece_view(weight, Piece(0, 1, 3, False))
    assert view.shape == (2, 3) and torch.equal(view, torch.arange(3.0, 9.0).reshape(2, 3))
    with torch.no_grad():
        view.copy_(torch.zeros(2, 3))
    assert torch.equal(weight.detach()[1:3], torch.zeros(2, 3)) and float(weight.detach()[3, 0]) == 9.0
    assert piece_view(weight, Piece(0, 0, 4, True)) is weight
    transposed = torch.nn.Parameter(torch.arange(12.0).reshape(3, 4).t())  # not contiguous: rows still view it
    with torch.no_grad():
        piece_view(transposed, Piece(0, 0, 1, False)).fill_(-1.0)
    assert torch.equal(transposed.detach()[0], torch.full((3,), -1.0))


def test_bad_splits_are_refused_in_one_line():
    with pytest.raises(SyncError, match=r"fragment split must be one of layers, bytes, got 'equal'"):
        fragment_pieces([torch.zeros(4)], 1, "equal")
    with pytest.raises(SyncError, match=r"fragments must be an integer in 1..5 \(the parameters' rows\), got 6"):
        split_fragments_by_bytes([2, 3], [4, 4], 6)
    with pytest.raises(SyncError, match="fragment_split must be one of layers, bytes"):
        SyncOptions.of(codec="none", optimizer="adamw", lr=0.01, total_steps=9, sync_every=4, fragment_split="even")
    with pytest.raises(SyncError, match="they need sync_every"):
        SyncOptions.of(codec="none", optimizer="adamw", lr=0.01, total_steps=9, fragment_split="bytes")


def test_a_split_parameter_moved_to_new_memory_is_refused_at_its_next_sync():
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Linear(64, 1))
    sync = StreamingOuterSync(list(model.named_parameters()), torch.optim.AdamW(model.parameters()),
                              lambda shadows: None, 4, 2, fragment_split="bytes")
    assert any(not p.whole for f in sync.fragments for p in f.pieces)
    model[0].weight.data = model[0].weight.data.clone()  # e.g. a .to(device) after the sync was built
    with pytest.raises(SyncError, match=r"parameter 0 \(split across fragments\) moved to new memory"):
        sync.after_inner_step(1, ComputeTimer())  # fragment 1 of 2 is due after step 1 (offset H/P = 2)
