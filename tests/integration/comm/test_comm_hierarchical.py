"""The hierarchical compressed all-reduce (geotrain.comm.hierarchical) in real gloo processes, and its
region partition (geotrain.comm.regions) as property tests."""

import pytest
import torch
from hier_workers import local_vector, reduce_steps
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.codecs import get_codec
from geotrain.comm.hierarchical import HierarchicalGroups, expected_link_bytes, shard_bounds, shard_pieces
from geotrain.comm.regions import Regions, RegionsError, format_regions, parse_regions, regions_of_devices
from geotrain.comm import run_workers


def _exact_mean(world: int, step: int, numel: int) -> torch.Tensor:
    return (sum(local_vector(r, step, numel).double() for r in range(world)) / world).float()


@pytest.mark.parametrize("sharded", [True, False])
def test_codec_none_gives_the_exact_mean_bit_identical_on_every_rank(sharded):
    lists = [[0, 1, 2], [3, 4], [5]]  # uneven regions: members own 1..3 shards
    out = run_workers(reduce_steps, 6, (lists, "none", {}, 2, 101, False, sharded), timeout_s=120)
    for step in range(2):
        assert torch.allclose(out[0]["means"][step], _exact_mean(6, step, 101), atol=1e-6, rtol=0)
        assert all(torch.equal(o["means"][step], out[0]["means"][step]) for o in out)
    for o in out:
        assert (o["intra"], o["inter"]) == (o["expected_intra"], o["expected_inter"])
    assert out[5]["intra"] == 0 and out[5]["inter"] > 0  # a one-member region sends only between regions
    if not sharded:  # leaders only: members 1.. of a region send nothing between regions
        assert [o["inter"] > 0 for o in out] == [True, False, False, True, False, True]


def test_one_region_is_a_plain_all_reduce_without_the_codec():
    out = run_workers(reduce_steps, 4, ([[0, 1, 2, 3]], "sign", {}, 1, 64, True), timeout_s=120)
    for o in out:
        assert torch.allclose(o["means"][0], o["plain_mean"], atol=1e-6, rtol=0)  # sign never applied
        assert o["inter"] == 0 and o["intra"] == o["expected_intra"] == 2 * 3 * 16 * 4
        assert torch.equal(o["means"][0], out[0]["means"][0])


@pytest.mark.parametrize("codec,params", [("sign", {}), ("int8", {}), ("topk", {"fraction": 0.1})])
def test_error_feedback_residuals_account_for_everything_not_sent(codec, params):
    """sum over steps of the means + sum over ranks of the residuals == sum over steps of the exact means."""
    steps, numel, segments = 5, 90, [20, 50, 20]  # per-segment pieces: per-tensor scales survive sharding
    out = run_workers(reduce_steps, 4, ([[0, 1], [2, 3]], codec, params, steps, numel, True, True, "fp32", segments),
                      timeout_s=120)
    sent = sum(out[0]["means"])
    residual = sum(o["residual"] for o in out)
    exact = sum(_exact_mean(4, step, numel) for step in range(steps))
    assert torch.allclose(sent + residual, exact, atol=1e-5, rtol=0)
    assert float((sent - exact).abs().max()) > 1e-4  # the codec did drop something
    for o in out:
        assert all(torch.equal(m, n) for m, n in zip(o["means"], out[0]["means"], strict=True))
        assert (o["intra"], o["inter"]) == (o["expected_intra"], o["expected_inter"])
        # posted (every step in flight at once, finished in order): the blocking means, bit for bit, same bytes
        assert all(torch.equal(m, n) for m, n in zip(o["posted_means"], o["means"], strict=True))
        assert o["posted_bytes"] == (o["intra"], o["inter"])


def test_fp16_inside_regions_halves_intra_bytes_and_stays_identical_on_every_rank():
    out = run_workers(reduce_steps, 4, ([[0, 1], [2, 3]], "none", {}, 1, 64, False, True, "fp16"), timeout_s=120)
    assert torch.allclose(out[0]["means"][0], _exact_mean(4, 0, 64), atol=2e-3, rtol=0)
    assert all(torch.equal(o["means"][0], out[0]["means"][0]) for o in out)
    assert out[0]["intra"] == out[0]["expected_intra"] == 2 * 32 * 2  # 32 values each way, 2 bytes


def _groups(regions: Regions, sharded: bool = True) -> HierarchicalGroups:
    """Groups without processes: expected_link_bytes reads only the partition and the shard count."""
    return HierarchicalGroups(regions, regions.shards if sharded else 1, (), {})


@pytest.mark.parametrize("codec", ["sign", "int8", "fp16", "none"])
def test_inter_region_bytes_follow_r_times_r_minus_1_payloads(codec):
    """R regions of k ranks: all ranks together send R (R - 1) x payload(n / k) per shard, k shards."""
    regions = Regions.of([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    c, n = get_codec(codec), 4096
    total = sum(expected_link_bytes(c, _groups(regions), rank, n).inter_bytes for rank in regions.ranks)
    assert total == 3 * 2 * 4 * c.wire_nbytes((n // 4,))
    leader = sum(expected_link_bytes(c, _groups(regions, False), rank, n).inter_bytes for rank in regions.ranks)
    assert leader == 3 * 2 * c.wire_nbytes((n,))
    intra = sum(expected_link_bytes(c, _groups(regions), rank, n).intra_bytes for rank in regions.ranks)
    assert intra == 12 * 2 * 3 * (n // 4) * 4  # reduce-scatter + all-gather: 2 (k - 1) n / k fp32 per rank


region_lists = st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=5), min_size=1, max_size=5).map(
    lambda lists: [list(dict.fromkeys(r for r in region if all(r not in other for other in lists[:i])))
                   for i, region in enumerate(lists)]).filter(lambda lists: all(lists))


@settings(max_examples=200, deadline=None)
@given(region_lists)
def test_regions_round_trip_through_text_and_partition_the_shards(lists):
    regions = Regions.of(lists)
    assert parse_regions(format_regions(regions)) == regions
    for region in range(regions.count):
        owned = sorted(s for rank in regions.members[region] for s in regions.owned_shards(rank))
        assert owned == list(range(regions.shards))  # each shard has exactly one owner per region
    for shard in range(regions.shards):
        group = regions.inter_group(shard)
        assert [regions.region_of(rank) for rank in group] == list(range(regions.count))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=12))
def test_regions_of_devices_groups_ranks_by_their_devices_region(region_of_device):
    devices = list(range(len(region_of_device)))[::-1]
    ranks = [10 + i for i in range(len(devices))]
    regions = regions_of_devices(ranks, devices, region_of_device)
    assert sorted(regions.ranks) == ranks
    for region in regions.members:
        assert len({region_of_device[devices[ranks.index(rank)]] for rank in region}) == 1
    assert regions.count == len(set(region_of_device))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 500), st.integers(1, 9), st.lists(st.integers(1, 60), min_size=1, max_size=8))
def test_shards_and_pieces_tile_the_vector(numel, shards, segments):
    bounds = shard_bounds(numel, shards)
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1
    total = sum(segments)
    for lo, hi in shard_bounds(total, shards):
        pieces = shard_pieces(lo, hi, segments)
        assert sum(b - a for a, b in pieces) == hi - lo


@pytest.mark.parametrize("text", ["", "0,1|1,2", "0,a", "0,1||2", "-1,0", 7])
def test_bad_region_text_raises_one_regions_error(text):
    with pytest.raises(RegionsError):
        parse_regions(text)
