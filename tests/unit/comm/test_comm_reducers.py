"""geotrain.comm's reducer registry: one shared contract for every reducer (codecs, powersgd, onebit),
checked in one process over a SimulatedCollective."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.codecs import CODECS, CodecError, pack_sign_bits
from geotrain.comm import OneBitLayout, ReducerContext, SimulatedCollective, clip_grad_norm_, get_reducer

SHAPES = [("w", (24, 16)), ("b", (24,)), ("v", (5, 3))]
SPECS = [name for name in CODECS if name not in ("powersgd",)] + ["powersgd:rank=2", "onebit", "topk:fraction=0.1"]


def _grads(workers: int, seed: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=generator) for _, shape in SHAPES] for _ in range(workers)]


@pytest.mark.parametrize("spec", SPECS)
def test_every_reducer_keeps_shapes_counts_its_bytes_and_restores_its_state_exactly(spec):
    workers = 3
    context = ReducerContext.of(SHAPES, workers, local_workers=workers, error_feedback=True)
    reducer, collective = get_reducer(spec, context), SimulatedCollective(workers)
    for step in range(2):
        means = reducer.reduce(_grads(workers, step), collective, step)
        assert [tuple(m.shape) for m in means] == [shape for _, shape in SHAPES]
        assert all(bool(torch.isfinite(m).all()) for m in means)
    assert reducer.declared_bytes == collective.ledger.handed_bytes > 0, spec  # declared == handed
    saved = reducer.state_dict()
    twin = get_reducer(spec, context)
    twin.load_state_dict(saved)
    if hasattr(reducer, "iteration"):
        assert twin.iteration == reducer.iteration
    nxt = _grads(workers, 9)
    a = reducer.reduce(nxt, SimulatedCollective(workers), 2)
    b = twin.reduce(nxt, SimulatedCollective(workers), 2)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), spec


def test_lossless_codec_reducer_returns_the_mean():
    workers = 4
    grads = _grads(workers, 0)
    reducer = get_reducer("none", ReducerContext.of(SHAPES, workers, local_workers=workers))
    means = reducer.reduce(grads, SimulatedCollective(workers), 0)
    for i, mean in enumerate(means):
        torch.testing.assert_close(mean, torch.stack([g[i] for g in grads]).mean(0))


def test_reducer_specs_are_checked_with_their_names():
    context = ReducerContext.of(SHAPES, 2)
    with pytest.raises(CodecError, match="unknown codec 'nope'"):
        get_reducer("nope", context)
    with pytest.raises(CodecError, match="powersgd has no parameter\\(s\\) start_iter"):
        get_reducer("powersgd:start_iter=2", context)
    with pytest.raises(CodecError, match="given twice"):
        get_reducer("topk:fraction=0.1", context, fraction=0.2)
    with pytest.raises(CodecError, match="onebit has no parameters"):
        get_reducer("onebit:rank=2", context)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-4, 4, allow_nan=False, width=32), min_size=1, max_size=200), st.integers(1, 4))
def test_onebit_messages_use_the_sign_codecs_bit_packing(values, world):
    layout = OneBitLayout([len(values)], world)
    chunk = layout.chunk(layout.pad(torch.tensor(values)), 0)
    message, decoded = layout.encode_chunk(chunk, 0)
    assert torch.equal(message[: layout.bit_bytes], pack_sign_bits(chunk))  # one packer, one bit order
    assert torch.equal(layout.decode_chunk(message, 0), decoded)


def test_global_clip_over_parts_equals_the_clip_of_the_whole():
    generator = torch.Generator().manual_seed(0)
    parts = [torch.randn(300, generator=generator), torch.randn(7, 5, generator=generator)]
    whole = torch.cat([p.reshape(-1) for p in parts])
    squares = [float(p.norm()) ** 2 for p in parts]  # what the other "stage" contributes to the all-reduce
    split_norm = clip_grad_norm_(parts[:1], 1.0, lambda local: local + squares[1])
    clip_grad_norm_(parts[1:], 1.0, lambda local: local + squares[0])
    assert split_norm == pytest.approx(float(clip_grad_norm_([whole], 1.0)), rel=1e-6)
    torch.testing.assert_close(torch.cat([p.reshape(-1) for p in parts]), whole)
    assert float(whole.norm()) == pytest.approx(1.0, rel=1e-5)


def test_a_codec_reducer_loads_its_codecs_compiled_kernels_when_it_is_built():
    """In a new interpreter (this one has loaded them already): for each codec, its numba kernel is not
    loaded before its reducer exists and is loaded once it does, so the first exchange does not pay the
    load (~0.5 s of CPU)."""
    import subprocess
    import sys

    script = ("import importlib\nfrom geotrain.comm import ReducerContext, get_reducer\n"
              "for spec, module, function in [('int8-block', 'geotrain.codecs.quantize', '_quantize_blocks'),\n"
              "                               ('sign', 'geotrain.codecs.sign', '_pack_signs'),\n"
              "                               ('topk', 'geotrain.codecs.selection', '_indices_at_least')]:\n"
              "    kernel = getattr(importlib.import_module(module), function)\n"
              "    before = len(kernel.signatures)\n"
              "    get_reducer(spec, ReducerContext.of([('w', (300, 300))], 2))\n"
              "    print(spec, before, len(kernel.signatures))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[:3] == ["int8-block 0 1", "sign 0 1", "topk 0 1"], out.stdout + out.stderr
