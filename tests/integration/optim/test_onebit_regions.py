"""1-bit Adam between regions only (geotrain.optim.region_collective), in 4 real gloo processes."""

import pytest
import torch
from hier_workers import region_onebit_adam, simulated_onebit_adam

from geotrain.comm import run_workers


@pytest.mark.parametrize("lists, rank_weighted", [([[0, 1], [2, 3]], False), ([[0, 1, 2], [3]], True)],
                         ids=["equal-regions", "uneven-rank-weighted"])
def test_region_onebit_adam_equals_the_simulation_of_region_workers_bit_for_bit(lists, rank_weighted):
    """Regions as workers; rank-weighted (geotrain train's), a region of 3 weighs 3 x a region of 1."""
    steps = 5
    ranks = run_workers(region_onebit_adam, 4, (lists, steps, rank_weighted), timeout_s=120)
    (reference,) = run_workers(simulated_onebit_adam, 1, (lists, steps, rank_weighted), timeout_s=120)
    for result in ranks:
        assert torch.equal(result["params"], reference)
    # warm-up (2 steps): each region's shard owners send their shards of the fp32 gradient to the other region;
    # compressed: their shards of one 1-bit message (all-to-all) and of one reply (all-gather)
    numel, message = ranks[0]["numel"], ranks[0]["message_bytes"]
    assert [sum(r["inter"][s] for r in ranks) for s in range(steps)] == [2 * 4 * numel] * 2 + [2 * 2 * message] * 3
