"""Streaming DiLoCo with fragments cut at equal bytes (fragment_split "bytes"), on real gloo processes: a
fragment's sync averages exactly its pieces of a split tensor and leaves the rest of it alone, its AdamW
moments travel with them, each sync sends 1/P of the model, and the replicas end equal."""

from __future__ import annotations

import pytest
import torch

from geotrain.codecs import get_codec
from geotrain.comm import run_workers
from geotrain.diloco import DiLoCo
from geotrain.sync.base import ComputeTimer
from geotrain.sync.streaming import fragment_due

H, P, STEPS = 4, 4, 9


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    # the first weight is 1024 of 1153 values: cut by layers, one fragment would hold 89% of the model
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).clone() for t in tensors])


def _value_ranges(model: torch.nn.Module, diloco: DiLoCo) -> list[list[tuple[int, int]]]:
    """Each fragment's ranges of the flattened model's values."""
    params = list(model.parameters())
    offsets = [0]
    for p in params:
        offsets.append(offsets[-1] + p.numel())
    row = [p.numel() // p.shape[0] for p in params]
    return [[(offsets[p.index] + p.start * row[p.index], offsets[p.index] + p.stop * row[p.index])
             for p in fragment.pieces] for fragment in diloco.sync.fragments]


def _loop(rank: int, world: int, codec: str, sync_moments: bool) -> dict:
    model = _model()
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(7 + rank)
    before, after = [], []

    def moments() -> torch.Tensor:
        return _flat(inner.state[p]["exp_avg"] for p in model.parameters())

    inner.register_step_post_hook(lambda *_: before.append((_flat(model.parameters()), moments())))
    with DiLoCo(model, inner, sync_every=H, fragments=P, fragment_split="bytes", codec=codec, outer_lr=1.0,
                outer_momentum=0.0, sync_moments=sync_moments) as diloco:
        inner.register_step_post_hook(
            lambda *_: after.append((_flat(model.parameters()), moments(), diloco.bytes_sent)))
        for _ in range(STEPS):
            x = torch.randn(16, 16, generator=data)
            loss = torch.nn.functional.mse_loss(model(x), x[:, :1] * x[:, 1:2])
            inner.zero_grad()
            loss.backward()
            inner.step()
    return {"before": before, "after": after, "ranges": _value_ranges(model, diloco), "bytes": diloco.bytes_sent,
            "declared": diloco.declared_bytes, "final": _flat(model.parameters()), "moments": moments(),
            "pieces": [[(p.index, p.whole) for p in f.pieces] for f in diloco.sync.fragments]}


@pytest.mark.parametrize("sync_moments", [False, True])
def test_a_fragment_sync_averages_exactly_its_pieces_of_a_split_tensor(sync_moments):
    results = run_workers(_loop, 2, ("none", sync_moments), timeout_s=180)
    ranges = results[0]["ranges"]
    sizes = [sum(b - a for a, b in r) for r in ranges]
    assert max(sizes) - min(sizes) <= 2 * 16 and sum(sizes) == 1153  # within a row (16 values) per cut
    assert [(0, False)] in results[0]["pieces"]  # a fragment holding part of the first weight only
    for step in range(STEPS - 1):  # the last step's flush syncs everything (below)
        due = [f for f in range(P) if fragment_due(step, f, P, H)]
        for part in (0, 1) if sync_moments else (0,):  # 0: parameters, 1: AdamW's first moments
            mean = sum(r["before"][step][part] for r in results) / 2
            for r in results:
                pre, post = r["before"][step][part], r["after"][step][part]
                inside = torch.zeros_like(pre, dtype=torch.bool)
                for f in due:
                    for a, b in ranges[f]:
                        inside[a:b] = True
                # outer averaging: a due fragment's values become the replicas' mean, every other value stays
                torch.testing.assert_close(post[inside], mean[inside], rtol=1e-6, atol=1e-7)
                assert torch.equal(post[~inside], pre[~inside])
                if due:
                    assert not torch.equal(pre[inside], mean[inside])  # the sync changed something
    assert torch.equal(results[0]["final"], results[1]["final"])
    if sync_moments:
        assert torch.equal(results[0]["moments"], results[1]["moments"])


def test_each_byte_split_sync_sends_its_fragment_as_declared():
    results = run_workers(_loop, 2, ("int4-block", False), timeout_s=180)
    codec = get_codec("int4-block")
    for r in results:
        assert r["bytes"] == r["declared"]
    assert torch.equal(results[0]["final"], results[1]["final"])
    sizes = [sum(b - a for a, b in r) for r in results[0]["ranges"]]
    payload = [codec.encode(torch.randn(n)).nbytes for n in sizes]  # a fragment's values, encoded flat
    running = [0] + [after[2] for after in results[0]["after"]]
    per_step = [b - a for a, b in zip(running, running[1:])]
    # H = P = 4: one fragment starts after every step (fragment f after steps f-1 mod 4); leaving the
    # context syncs every fragment once more but the one that synced after the last step
    due = [next(f for f in range(P) if fragment_due(step, f, P, H)) for step in range(STEPS)]
    assert per_step == [payload[f] for f in due]
    assert results[0]["bytes"] - running[-1] == sum(payload) - payload[due[-1]]
    assert max(payload) <= 1.01 * sum(payload) / P  # no sync sends more than a quarter of the model
