"""Streaming DiLoCo (geotrain.sync.streaming): fragments, their schedule, overlap with delay, and
P = 1, tau = 0 equal to blocking OuterSync bit for bit, on real gloo processes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.sync.base import ComputeTimer
from geotrain.comm import run_workers
from geotrain.optim.outer import OuterStep
from geotrain.sync import OuterSync, StageExchange, SyncError, SyncOptions
from geotrain.sync.exchange import DirectTransport
from geotrain.sync.streaming import StreamingOuterSync, fragment_due, split_fragments, syncs_started


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 1000), min_size=1, max_size=30), data=st.data())
def test_fragments_are_contiguous_non_empty_and_balanced(sizes, data):
    p = data.draw(st.integers(1, len(sizes)))
    pieces = split_fragments(sizes, p)
    assert len(pieces) == p and all(len(r) >= 1 for r in pieces)
    assert [i for r in pieces for i in r] == list(range(len(sizes)))  # contiguous, in order
    total = sum(sizes)
    # each cut is at the running sum nearest its target, unless keeping fragments non-empty forbids it
    for k, r in enumerate(pieces[1:], start=1):
        before = sum(sizes[:r.start])
        gap = abs(before - k * total / p)
        if r.start > pieces[k - 1].start + 1 and r.start < len(sizes) - (p - k):
            assert gap <= max(sizes) / 2 + 1e-9


def test_balanced_split_of_equal_layers_gives_equal_fragments():
    assert split_fragments([4] * 8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert split_fragments([100, 1, 1, 1, 100], 2) == [range(0, 2), range(2, 5)]
    with pytest.raises(SyncError, match=r"fragments must be an integer in 1..3"):
        split_fragments([1, 2, 3], 4)


@pytest.mark.parametrize("h,p", [(8, 4), (6, 4), (5, 1), (3, 3)])
def test_each_fragment_syncs_once_per_period_at_its_offset(h, p):
    for fragment in range(p):
        steps = [s for s in range(4 * h) if fragment_due(s, fragment, p, h)]
        offset = fragment * h // p
        assert steps == [offset - 1 + k * h for k in range(5) if 0 <= offset - 1 + k * h < 4 * h]
    assert [s for s in range(2 * h) if fragment_due(s, 0, p, h)] == [h - 1, 2 * h - 1]  # fragment 0: blocking's


@settings(max_examples=200, deadline=None)
@given(h=st.integers(1, 12), data=st.data())
def test_syncs_started_counts_the_due_steps_before_a_step(h, data):
    p = data.draw(st.integers(1, h))
    fragment = data.draw(st.integers(0, p - 1))
    step = data.draw(st.integers(0, 6 * h))
    assert syncs_started(step, fragment, p, h) == sum(fragment_due(s, fragment, p, h) for s in range(step))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1))


def _train(sync, model: torch.nn.Module, rank: int, steps: int) -> list[int]:
    data = torch.Generator().manual_seed(100 + rank)
    timer = ComputeTimer()
    sent = []
    for step in range(steps):
        x = torch.randn(8, 6, generator=data)
        sync.optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), x[:, :1] - x[:, 1:2]).backward()
        sent.append(sync.step(step, timer).dp_bytes)
    return sent



def _streaming(model, codec, sync_every, fragments, delay, mix, steps, group=None):
    named = list(model.named_parameters())
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    return StreamingOuterSync(named, inner, lambda shadows: StageExchange(shadows, codec, True, DirectTransport(),
                                                                         group, []),
                              sync_every, fragments, delay, mix, total_steps=steps)


def _blocking_vs_streaming(rank: int, world: int, codec: str) -> dict:
    steps, h = 11, 3
    reference = _model()
    named = list(reference.named_parameters())
    inner = torch.optim.AdamW(reference.parameters(), lr=0.01)
    blocking = OuterSync([p for _, p in named], inner, OuterStep([p for _, p in named], h),
                         StageExchange(named, codec, True, DirectTransport(), None, []), steps)
    blocking_bytes = _train(blocking, reference, rank, steps)
    model = _model()
    streaming = _streaming(model, codec, h, 1, 0, 0.0, steps)
    streaming_bytes = _train(streaming, model, rank, steps)
    return {"same": all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters())),
            "bytes": (blocking_bytes, streaming_bytes), "fingerprint": streaming.fingerprint(),
            "anchors": blocking.fingerprint() == streaming.fingerprint()}


@pytest.mark.parametrize("codec", ["int8-block", "none"])
def test_one_fragment_without_delay_is_blocking_diloco_bit_for_bit(codec):
    results = run_workers(_blocking_vs_streaming, 2, (codec,), timeout_s=180)
    for result in results:
        assert result["same"] and result["anchors"]
        blocking, streaming = result["bytes"]
        assert blocking == streaming and sum(1 for b in streaming if b) == 4  # steps 2, 5, 8 and the last, 10
    assert results[0]["fingerprint"] == results[1]["fingerprint"]


def _streamed(rank: int, world: int, fragments: int, delay: int, mix: float) -> dict:
    steps = 17
    model = _model()
    sync = _streaming(model, "int8-block", 8, fragments, delay, mix, steps)
    sent = _train(sync, model, rank, steps)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"sent": sent, "params": flat, "in_flight": sync.in_flight,
            "fragment_numels": [sum(model_p.numel() for model_p in f.outer.params) for f in sync.fragments]}


@pytest.mark.parametrize("fragments,delay,mix", [(4, 1, 0.5), (4, 3, 0.0), (2, 0, 0.0)])
def test_streaming_replicas_agree_after_the_last_step_and_send_a_fragment_at_a_time(fragments, delay, mix):
    results = run_workers(_streamed, 2, (fragments, delay, mix), timeout_s=180)
    assert torch.equal(results[0]["params"], results[1]["params"])  # the last step synced every fragment
    assert results[0]["in_flight"] == 0
    numels = results[0]["fragment_numels"]
    full = sum(numels) + 4 * -(-sum(numels) // 256)  # int8-block of the whole model
    sent = results[0]["sent"]
    # before the final flush no step hands more than the largest fragment (int8-block: n + 4 per block)
    largest = max(n + 4 * -(-n // 256) for n in numels)
    assert max(sent[:-1]) <= largest < full
    # steps 0..15: each fragment synced twice (H=8), landing `delay` steps after it started
    starts = {p: [s for s in range(16) if fragment_due(s, p, fragments, 8)] for p in range(fragments)}
    landed = sorted(s + delay for p in starts for s in starts[p] if s + delay < 16)
    assert [s for s in range(16) if sent[s]] == sorted(set(landed))


def test_delay_must_stay_below_sync_every_and_mix_in_unit_interval():
    model = _model()
    with pytest.raises(SyncError, match=r"delay must be an integer in 0..3 \(below sync_every\), got 4"):
        StreamingOuterSync(list(model.named_parameters()), torch.optim.SGD(model.parameters(), lr=0.1),
                           lambda shadows: None, 4, 1, 4)
    with pytest.raises(SyncError, match=r"mix .* must be a number in \[0, 1\], got 1.5"):
        StreamingOuterSync(list(model.named_parameters()), torch.optim.SGD(model.parameters(), lr=0.1),
                           lambda shadows: None, 4, 1, 1, 1.5)
    with pytest.raises(SyncError, match=r"fragments must be at most sync_every \(4\)"):
        StreamingOuterSync(list(model.named_parameters()), torch.optim.SGD(model.parameters(), lr=0.1),
                           lambda shadows: None, 4, 5)


def _from_options(rank: int, world: int) -> tuple[str, int, list[int], str]:
    from geotrain.sync import DPGroup, SyncOptions, make_gradient_sync

    model = _model()
    options = SyncOptions.of(codec="fp4-block", optimizer="adamw", lr=0.01, total_steps=9, sync_every=4, fragments=2,
                             delay=1, mix=0.5)
    sync = make_gradient_sync(options, list(model.named_parameters()), DirectTransport(),
                              DPGroup(None, (0, 1), (0, 1)), rank)
    sent = _train(sync, model, rank, 9)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return type(sync).__name__, len(sync.fragments), sent, repr(flat.double().sum().item())


def test_sync_options_with_fragments_and_delay_build_the_streaming_sync():
    results = run_workers(_from_options, 2, (), timeout_s=120)
    name, fragments, sent, total = results[0]
    assert (name, fragments) == ("StreamingOuterSync", 2) and results[1][3] == total
    # fragment 0 starts at steps 3, 7 and lands at 4, 8 (8 is the last step: flush); fragment 1 starts at 1, 5
    assert [s for s, b in enumerate(sent) if b] == [2, 4, 6, 8]
    with pytest.raises(SyncError, match="they need sync_every"):
        SyncOptions.of(codec="none", optimizer="adamw", lr=0.01, total_steps=9, fragments=2)
