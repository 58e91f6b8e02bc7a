"""HeLoCo's direction-aware correction of stale outer gradients (geotrain.sync.async_merge) and its reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.sync.async_merge import AsyncMerge, outer_optimizer, remove_opposing
from geotrain.sync.async_server import OuterServer, Request
from geotrain.sync.base import SyncError

_vectors = st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=4, max_size=4)


def test_an_opposing_component_is_removed_and_the_rest_kept():
    corrected = remove_opposing(torch.tensor([-2.0, 3.0]), torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(corrected, torch.tensor([0.0, 3.0]))


def test_an_aligned_or_orthogonal_gradient_is_returned_as_it_came():
    gradient = torch.tensor([2.0, -3.0])
    assert remove_opposing(gradient, torch.tensor([1.0, 0.0])) is gradient
    assert remove_opposing(gradient, torch.tensor([0.0, 0.0])) is gradient


@settings(max_examples=200, deadline=None)
@given(_vectors, _vectors)
def test_the_corrected_gradient_never_opposes_the_reference_nor_grows(g, r):
    gradient, reference = torch.tensor(g), torch.tensor(r)
    corrected = remove_opposing(gradient, reference)
    # float32 rounding of the projection: a few ulps of the products' size
    scale = float(gradient.abs().max() * reference.abs().max() * 4 + 1e-30)
    assert float(corrected.double() @ reference.double()) >= -1e-5 * scale
    assert float(corrected.norm()) <= float(gradient.norm()) * (1 + 1e-5) + 1e-6
    if float(gradient.double() @ reference.double()) >= 0:
        assert corrected is gradient


def test_heloco_corrects_only_stale_arrivals_against_the_decayed_sum_of_applied_updates():
    merge = AsyncMerge("heloco", decay=0.5)
    fresh = torch.tensor([-1.0, 1.0])
    assert merge.correct(fresh, staleness=3) is fresh  # nothing applied yet: no reference
    merge.observe(torch.tensor([1.0, 1.0]), torch.tensor([0.0, 1.0]))  # the server moved theta by -(1, 0)
    merge.observe(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0]))  # then by -(0, 1): r = 0.5 (1, 0) + (0, 1)
    torch.testing.assert_close(merge.reference, torch.tensor([0.5, 1.0]))
    assert merge.correct(fresh, staleness=0) is fresh
    stale = torch.tensor([0.0, -2.5])  # <g, r> = -2.5, |r|^2 = 1.25: g - (-2) r
    torch.testing.assert_close(merge.correct(stale, staleness=1), torch.tensor([1.0, -0.5]))
    assert merge.corrected == 1


def test_staleness_mode_leaves_every_gradient_and_keeps_no_reference():
    merge = AsyncMerge("staleness")
    merge.observe(torch.ones(2), torch.zeros(2))
    gradient = torch.tensor([-1.0, -1.0])
    assert merge.correct(gradient, staleness=5) is gradient and merge.reference is None


def test_the_reference_survives_a_state_dict_round_trip():
    merge = AsyncMerge("heloco")
    merge.observe(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0]))
    restored = AsyncMerge("heloco")
    restored.load_state_dict(merge.state_dict())
    torch.testing.assert_close(restored.reference, torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="heloco"):
        AsyncMerge("staleness").load_state_dict(merge.state_dict())


@pytest.mark.parametrize("mode, decay", [("median", 0.9), ("heloco", 1.0), ("heloco", -0.1), ("heloco", True)])
def test_a_bad_mode_or_decay_is_refused_with_its_value(mode, decay):
    with pytest.raises(SyncError, match="async merge"):
        AsyncMerge(mode, decay)


def test_a_server_behind_heloco_drops_a_stale_arrivals_pull_against_the_fresher_updates():
    # lr 1, no momentum, period 1, no staleness weight: theta -= g' (easy to follow)
    server = OuterServer(torch.zeros(2), outer_optimizer("heloco", 1, 1.0, 0.0, 0.0), [0, 1], 8)
    server.submit(Request(0, 0, torch.tensor([1.0, 0.0])))      # fresh: theta = (-1, 0), r = (1, 0)
    server.submit(Request(1, 0, torch.tensor([-2.0, 1.0])))     # 1 stale, opposes r: applied as (0, 1)
    torch.testing.assert_close(server.model, torch.tensor([-1.0, -1.0]))
    plain = OuterServer(torch.zeros(2), outer_optimizer("staleness", 1, 1.0, 0.0, 0.0), [0, 1], 8)
    plain.submit(Request(0, 0, torch.tensor([1.0, 0.0])))
    plain.submit(Request(1, 0, torch.tensor([-2.0, 1.0])))
    torch.testing.assert_close(plain.model, torch.tensor([1.0, -1.0]))
    state = server.optimizer.state_dict()  # the reference is saved with the outer optimizer's state
    torch.testing.assert_close(state["merge"]["reference"], torch.tensor([0.9, 1.0]))
