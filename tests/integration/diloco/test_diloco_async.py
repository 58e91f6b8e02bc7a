"""Asynchronous DiLoCo (`DiLoCo(asynchronous=True)`, geotrain.sync.async_outer) in real gloo processes: a
slow rank does not hold the fast ones, every rank ends with the same final global model, the staleness
bound holds, the hierarchical variant merges inside a region before it crosses to another, and the server's own
rank waits for its reply no longer than the timeout (a run's --comm-timeout)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from geotrain.comm import run_workers
from geotrain.diloco import DiLoCo
from geotrain.sync import SyncError
from geotrain.sync.async_outer import AsyncOuterSync
from geotrain.sync.async_wire import ReplyTimeout


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _async_loop(rank: int, world: int, target: int, slow: dict, bound: int, regions, merge_every) -> dict:
    torch.manual_seed(rank)  # different models before the start: the broadcast makes them one
    model = _model() if rank == 0 else torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                                             torch.nn.Linear(16, 1))
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(7 + rank)
    with DiLoCo(model, inner, sync_every=3, asynchronous=True, staleness_bound=bound, regions=regions,
                merge_every=merge_every, outer_lr=0.7, outer_momentum=0.9) as diloco:
        while diloco.outer_step < target:
            x = torch.randn(16, 8, generator=data)
            loss = torch.nn.functional.mse_loss(model(x), x[:, :1] - 0.5 * x[:, 1:2])
            inner.zero_grad()
            loss.backward()
            if rank in slow:
                time.sleep(slow[rank])  # a slow site's compute
            inner.step()
        loop_outer_step = diloco.outer_step
    stats = diloco.asynchronous.stats()  # after the final exchange: the servers' counts are complete
    stats["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    stats["loop_outer_step"] = loop_outer_step
    stats["built_a_sync"] = diloco.sync is not None or bool(diloco.exchanges)  # the servers hold the exchange
    return stats


def _run(world, target, slow, bound, regions=None, merge_every=None):
    return run_workers(_async_loop, world, (target, slow, bound, regions, merge_every), timeout_s=240)


def test_a_slow_rank_does_not_hold_the_fast_ones_and_all_end_with_the_same_model():
    results = _run(4, 30, {3: 0.1}, bound=16)
    for r in results[1:]:
        assert torch.equal(r["params"], results[0]["params"])
    assert not any(r["built_a_sync"] for r in results)  # no synchronous outer sync's shadows beside the servers
    fast, slow = [r["pushes"] for r in results[:3]], results[3]["pushes"]
    # lock-step, each rank would send as many updates as the slow one (0.1 s per inner step, 3 per
    # update): the three fast ranks together send 3x its count; unheld, at least twice that
    assert sum(fast) + slow >= 30 and slow >= 1
    assert sum(fast) >= 6 * slow
    assert results[0]["max_staleness"][0] <= 16
    assert all(r["loop_outer_step"] >= 30 for r in results)
    assert len({r["outer_step"] for r in results}) == 1  # the final model's count, the same everywhere


def test_the_staleness_bound_is_held_and_fast_ranks_wait_at_it():
    results = _run(3, 18, {2: 0.05}, bound=2)
    assert results[0]["max_staleness"][0] <= 2
    for r in results[1:]:
        assert torch.equal(r["params"], results[0]["params"])
    # with the bound at 2 the fast ranks together get at most 2 versions ahead of the slow one, so per slow
    # update they send a few (2 applied alone, more when merged with it at the bound), not the ~10x they
    # send unbounded at this speed ratio
    assert sum(r["pushes"] for r in results[:2]) <= 4 * (results[2]["pushes"] + 1) + 2


def _cross_region_bytes(results, regions) -> int:
    region_of = {rank: i for i, region in enumerate(regions) for rank in region}
    return sum(nbytes for rank, r in enumerate(results) for peer, nbytes in r["sent_to"].items()
               if region_of[peer] != region_of[rank])


def test_hierarchical_merges_inside_a_region_before_crossing():
    # staleness bound 0 makes both runs lock-step, so every rank's count of updates (and bytes) is exact
    regions = [[0, 1], [2, 3]]
    m = 4 * sum(p.numel() for p in _model().parameters())  # the model's fp32 bytes
    flat = _run(4, 16, {}, bound=0)
    hier = _run(4, 16, {}, bound=0, regions=regions, merge_every=2)
    for results in (flat, hier):
        for r in results[1:]:
            assert torch.equal(r["params"], results[0]["params"])
    assert [r["pushes"] for r in flat] == [4, 4, 4, 4]
    # flat: ranks 2 and 3 send 4 updates each (40-byte header + M) to rank 0 and get 4 models back
    # (40-byte header + M), then a final header and the final model
    assert _cross_region_bytes(flat, regions) == 2 * (4 * (40 + m + 40 + m) + 40 + 40 + m)
    # hierarchical: inside region 1, every 2 region updates (4 replica updates) its server crosses once
    # with the region's delta and gets the global model back
    region_updates = sum(r["pushes"] for r in hier[2:]) // 2
    merges = region_updates // 2 + 1  # and the final merge
    assert _cross_region_bytes(hier, regions) <= merges * (40 + m + 40 + m)
    assert 2 * _cross_region_bytes(hier, regions) < _cross_region_bytes(flat, regions)


def _refused(rank: int, world: int) -> str:
    model = _model()
    try:
        DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2, asynchronous=True, fragments=2)
    except SyncError as exc:
        return str(exc)
    return ""


def test_unsupported_settings_are_refused_in_one_line():
    message = run_workers(_refused, 1, timeout_s=60)[0]
    assert message == ("DiLoCo(asynchronous=True): fragments must be 1 (whole-model updates through the global "
                       "model's server, on the default group), got 2")


HELD_TIMEOUT_S = 1.5


def _held_by_a_live_peer(rank: int, world: int) -> tuple[float, str] | None:
    """Rank 1 stays alive and never sends (a site slowed 1000x); rank 0, the server's rank, sends its final update:
    its reply waits for rank 1's, in process."""
    model = _model()
    outer = AsyncOuterSync(list(model.parameters()), 2, outer_lr=1.0, outer_momentum=0.0, timeout_s=HELD_TIMEOUT_S)
    if rank == 1:
        time.sleep(2 * HELD_TIMEOUT_S + 1)
        return None
    started = time.monotonic()
    try:
        outer.finish()
    except ReplyTimeout as exc:
        return time.monotonic() - started, str(exc)
    finally:
        outer.close()
    return None


def test_the_servers_own_rank_waits_for_its_reply_at_most_the_timeout():
    # a remote client's wait is a gloo receive on a group with the timeout; the server's rank waited on a queue
    # without one, so a run with a slow but live site never ended (--comm-timeout 30: 200 s and counting)
    held_s, message = run_workers(_held_by_a_live_peer, 2, timeout_s=60)[0]
    assert HELD_TIMEOUT_S <= held_s < HELD_TIMEOUT_S + 1.5
    assert message.startswith("Timed out waiting 1500ms for the reply of the outer updates' server in this process")
