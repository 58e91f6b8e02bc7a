"""The direct gather (one all-to-all round) in real gloo processes: the codec reducer's decoded means
equal the ring all-gather's bit for bit, blocking and posted, and the bytes handed equal the declared;
the DiLoCo user-loop API given the links trains exactly as with the ring (one launch for both)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geotrain.codecs import CodecSpec
from geotrain.comm import CodecReducer, TorchCollective, run_workers
from geotrain.comm.gather import GatherLinks

SHAPES = [("w", (40, 33)), ("b", (33,))]
WORLD = 3


def _links() -> GatherLinks:
    """3 members 100 ms apart on 1 Gbit/s: latency-bound, so every payload here goes direct."""
    latency = np.full((WORLD, WORLD), 0.1) - 0.1 * np.eye(WORLD)
    return GatherLinks.of(latency, np.full((WORLD, WORLD), 1e9), np.full(WORLD, np.inf), range(WORLD))


def _worker(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    collective = TorchCollective()
    results = {}
    all_to_all, direct_calls = dist.all_to_all_single, []

    def counted(*args, **kwargs):
        direct_calls.append(1)
        return all_to_all(*args, **kwargs)

    dist.all_to_all_single = counted  # this worker process only: which exchanges went direct
    for name, links in (("ring", None), ("direct", _links())):
        reducer = CodecReducer(CodecSpec.parse("int4-block").build(), SHAPES, world_size, gather_links=links)
        means = []
        for step in range(2):  # two steps: the second carries error feedback
            torch.manual_seed(10 * rank + step)
            grads = [torch.randn(shape) for _, shape in SHAPES]
            if step == 0:
                means.append(reducer.reduce([grads], collective, step))
            else:
                means.append(reducer.start([grads], collective, step)())
        results[name] = {"means": [[t.clone() for t in m] for m in means],
                         "declared": reducer.declared_bytes, "handed": collective.ledger.handed_bytes,
                         "calls": dict(collective.ledger.calls), "all_to_all": len(direct_calls)}
        collective.ledger.reset()
        direct_calls.clear()
    for name, links in (("diloco ring", None), ("diloco direct", _links())):
        results[name] = _diloco_loop(rank, links)
    results["diloco all_to_all"] = len(direct_calls)
    return results


def _diloco_loop(rank: int, links: GatherLinks | None) -> torch.Tensor:
    """Streaming DiLoCo (2 fragments, tau 1, int4-block) around a plain loop: the final weights."""
    from geotrain.diloco import DiLoCo

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(5 + rank)
    with DiLoCo(model, inner, sync_every=2, fragments=2, delay=1, mix=0.5, codec="int4-block",
                gather_links=links):
        for _ in range(5):
            x = torch.randn(8, 6, generator=data)
            inner.zero_grad()
            torch.nn.functional.mse_loss(model(x), x[:, :1]).backward()
            inner.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.timeout(60)
def test_direct_gather_decodes_as_the_ring_bit_for_bit_and_hands_the_declared_bytes_also_under_diloco():
    assert _links().algorithm(1000.0) == "direct"
    results = run_workers(_worker, WORLD, timeout_s=50.0)
    for rank in results:
        ring, direct = rank["ring"], rank["direct"]
        for ring_step, direct_step in zip(ring["means"], direct["means"], strict=True):
            for a, b in zip(ring_step, direct_step, strict=True):
                assert torch.equal(a, b)
        for row in (ring, direct):
            assert row["handed"] == row["declared"] > 0
            assert row["calls"] == {"all_gather": 2}
        assert (ring["all_to_all"], direct["all_to_all"]) == (0, 2)
        assert direct["declared"] == ring["declared"]
    for rank in results:  # DiLoCo: the same weights with the links (direct) as without (ring)
        assert torch.equal(rank["diloco ring"], rank["diloco direct"]) and rank["diloco all_to_all"] > 0
    assert torch.equal(results[0]["diloco direct"], results[2]["diloco direct"])
    # every rank decodes the same means
    for step in range(2):
        for other in results[1:]:
            assert all(torch.equal(a, b) for a, b in zip(results[0]["direct"]["means"][step],
                                                          other["direct"]["means"][step], strict=True))
