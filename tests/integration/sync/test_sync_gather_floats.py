"""geotrain.sync.adaptive.gather_floats in real gloo processes: each rank's few floats reach every rank in rank
order, by the ring all-gather or, where the members' links make one all-to-all round faster (latency-bound WAN
links, four sites), by that round; both give the same (world, k) tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geotrain.comm import run_workers
from geotrain.comm.gather import GatherLinks
from geotrain.sync.adaptive import gather_floats

WORLD = 4


def _links() -> GatherLinks:
    off = ~np.eye(WORLD, dtype=bool)
    return GatherLinks.of(np.where(off, 0.1, 0.0), np.where(off, 1e8, 0.0), np.full(WORLD, np.inf), range(WORLD))


def _gather(rank: int, world: int) -> dict:
    waited: list[str] = []
    mine = torch.tensor([float(rank), 10.0 + rank], dtype=torch.float64)
    results = {}
    for name, links in (("ring", None), ("direct", _links())):
        wait = gather_floats(None, lambda w, name=name: (waited.append(name), w())[1], links)(mine)
        results[name] = wait().tolist()
    return {**results, "waited": waited}


@pytest.mark.timeout(120)
def test_ring_and_direct_rounds_give_every_rank_the_floats_in_rank_order():
    assert _links().algorithm(16) == "direct"  # 16 bytes over 100 ms links: one round beats three
    expected = [[float(r), 10.0 + r] for r in range(WORLD)]
    for result in run_workers(_gather, WORLD, timeout_s=100):
        assert result["ring"] == expected and result["direct"] == expected
        assert result["waited"] == ["ring", "direct"]  # each wait goes through the caller's run()
