"""The per-sample delta wire of a pipeline cut (runtime/delta_wire.py): both sides keep the same state after any
sequence of samples, a first sight crosses at the `first` codec, evaluation touches no state, and the settings
where sample identity or the state's life is unknown are refused in one line."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.codecs import CodecError, CodecSpec, get_codec
from geotrain.codecs.carrier import carrier_numel
from geotrain.codecs.delta import DeltaSpec, delta_memory_refusal
from geotrain.data import window_ids
from geotrain.runtime.delta_wire import NO_SAMPLE, DeltaWire, fingerprint

SAMPLE = (4, 64)  # tokens x hidden of one sample
SPEC = CodecSpec.parse("delta:codec=int2-block,first=int8-block,grad=int4-block")


def _cut() -> tuple[DeltaWire, DeltaWire]:
    return DeltaWire(SPEC), DeltaWire(SPEC)


def _cross(sender: DeltaWire, receiver: DeltaWire, ids: list[int], hidden: torch.Tensor,
           training: bool = True) -> tuple[bool, torch.Tensor, torch.Tensor]:
    """One step of one micro-batch across the cut: (wide, carrier, the receiver's activations)."""
    wide = sender.begin_step(ids) if training else True
    assert (receiver.begin_step(ids) if training else True) == wide
    carrier = sender.encode_forward(hidden, training)
    return wide, carrier, receiver.decode_forward(carrier, SAMPLE, training)


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=4), min_size=1, max_size=6),
       seed=st.integers(0, 2**16))
def test_both_sides_keep_the_same_state_after_any_sequence_of_samples(steps, seed):
    sender, receiver = _cut()
    generator = torch.Generator().manual_seed(seed)
    for ids in steps:
        hidden = torch.randn(len(ids), *SAMPLE, generator=generator)
        _, _, received = _cross(sender, receiver, ids, hidden)
        # what the receiver computes on is the sender's state of those samples, bit for bit
        assert torch.equal(received, torch.stack([sender.memory.values[i] for i in ids]))
    assert sender.memory.values.keys() == receiver.memory.values.keys() == {i for ids in steps for i in ids}
    for key, value in sender.memory.values.items():
        assert torch.equal(value, receiver.memory.values[key])
    assert fingerprint(sender.memory) == fingerprint(receiver.memory)


def test_a_first_sight_crosses_at_the_first_codec_and_a_second_as_a_delta():
    sender, receiver = _cut()
    hidden = torch.randn(2, *SAMPLE, generator=torch.Generator().manual_seed(0))
    first, codec, grad = (get_codec(name) for name in ("int8-block", "int2-block", "int4-block"))
    wide, carrier, received = _cross(sender, receiver, [3, 7], hidden)
    assert wide and carrier.shape == (2, 1 + max(carrier_numel(first, SAMPLE), carrier_numel(grad, SAMPLE)))
    assert torch.equal(received, torch.stack([first.roundtrip(row)[0] for row in hidden]))  # int8-block, absolute
    assert carrier[:, 0].contiguous().view(torch.int32).tolist() == [3, 7]  # the ids ride along
    moved = hidden + 0.01 * torch.randn(2, *SAMPLE, generator=torch.Generator().manual_seed(1))
    wide, carrier, received = _cross(sender, receiver, [3, 7], moved)
    assert not wide and carrier.shape == (2, 1 + max(carrier_numel(codec, SAMPLE), carrier_numel(grad, SAMPLE)))
    step_error = (received - moved).abs().max()  # a 2-bit delta of a small change: closer than 2 bits of the value
    assert step_error < (torch.stack([codec.roundtrip(row)[0] for row in moved]) - moved).abs().max() / 4
    wide, _, _ = _cross(sender, receiver, [7, 9], moved)  # one unseen sample makes the whole step wide
    assert wide


def test_a_memory_saved_and_loaded_carries_on_as_the_one_that_was_not():
    sender, receiver = _cut()
    generator = torch.Generator().manual_seed(2)
    _cross(sender, receiver, [5, 1, 3], torch.randn(3, *SAMPLE, generator=generator))
    loaded = DeltaWire(SPEC)
    loaded.memory.load_state_dict(receiver.memory.state_dict())
    assert loaded.memory.state_dict()["ids"].tolist() == [1, 3, 5]
    hidden = torch.randn(2, *SAMPLE, generator=generator)
    _, carrier, kept = _cross(sender, receiver, [3, 5], hidden)
    assert not loaded.begin_step([3, 5])  # the loaded side knows the samples: a narrow step
    assert torch.equal(loaded.decode_forward(carrier, SAMPLE, True), kept)
    empty = DeltaWire(SPEC)
    empty.memory.load_state_dict(DeltaWire(SPEC).memory.state_dict())
    assert empty.memory.values == {}
    with pytest.raises(ValueError, match="2 sample ids but"):
        empty.memory.load_state_dict({"ids": torch.tensor([1, 2]), "values": torch.zeros(3, *SAMPLE)})


def test_evaluation_sends_the_first_codec_and_touches_no_state():
    sender, receiver = _cut()
    _cross(sender, receiver, [1], torch.randn(1, *SAMPLE))
    before = {k: v.clone() for k, v in sender.memory.values.items()}
    hidden = torch.randn(3, *SAMPLE)
    _, carrier, received = _cross(sender, receiver, [], hidden, training=False)
    assert carrier[:, 0].contiguous().view(torch.int32).tolist() == [NO_SAMPLE] * 3
    assert torch.equal(received, torch.stack([get_codec("int8-block").roundtrip(row)[0] for row in hidden]))
    for memory in (sender.memory, receiver.memory):
        assert memory.values.keys() == before.keys() and torch.equal(memory.values[1], before[1])


def test_gradients_cross_at_the_grad_codec_in_the_carrier_shape():
    sender, receiver = _cut()
    hidden = torch.randn(2, *SAMPLE, requires_grad=True)
    for side in (sender, receiver):
        side.begin_step([0, 1])
    carrier = sender.send(hidden)
    carried = carrier.detach().requires_grad_()
    received = receiver.receive(carried, SAMPLE)
    upstream = torch.randn_like(received)
    received.backward(upstream)
    wire_grad = carried.grad
    assert wire_grad.shape == carrier.shape  # what torch's schedule sends back: the carrier's shape
    carrier.backward(wire_grad)
    assert torch.equal(hidden.grad, torch.stack([get_codec("int4-block").roundtrip(row)[0] for row in upstream]))


def test_a_top_k_gradient_with_parameters_crosses_a_cut_and_is_priced_by_its_width():
    text = "delta:codec=sign-block,first=int4-block,grad=topk-lowbit/fraction=0.0625/bits=4"
    spec = CodecSpec.parse(text)
    assert CodecSpec.parse(str(spec)) == spec  # the nested spec survives the printed form
    sender, receiver = DeltaWire(spec), DeltaWire(spec)
    grad_codec = get_codec("topk-lowbit", fraction=0.0625, bits=4)
    sample = (96, 128)  # the bench's cut: 3 chunks of 4096, 256 values kept per chunk
    for side in (sender, receiver):
        side.memory.values.update({i: torch.zeros(sample) for i in (0, 1)})  # seen: a narrow step (sign-block deltas)
        assert not side.begin_step([0, 1])
    hidden = torch.randn(2, *sample, requires_grad=True)
    carrier = sender.send(hidden)
    assert carrier.shape == (2, 1 + carrier_numel(grad_codec, sample))  # the top-k payload is the wider one
    carried = carrier.detach().requires_grad_()
    upstream = torch.randn(2, *sample, generator=torch.Generator().manual_seed(3))
    receiver.receive(carried, sample).backward(upstream)
    carrier.backward(carried.grad)
    expected = torch.stack([grad_codec.roundtrip(row)[0] for row in upstream])
    assert torch.equal(hidden.grad, expected) and int((expected != 0).sum(dim=(1, 2))[0]) == 3 * 256
    delta = DeltaSpec.of(spec)
    assert delta.steady_bytes_per_value(sample, 4) == grad_codec.wire_nbytes(sample) / (96 * 128)
    from geotrain.cost.codec_choice import codec_link_bytes
    from geotrain.job import JOB_PRESETS

    job = JOB_PRESETS["gpt-1.3b-seed"]  # [2048, 2048] per sample
    assert codec_link_bytes(text, job, "pp").pp_inter == pytest.approx(16 * 2.5 / 256 + 4 / 4096)
    # a rank-2 gradient is priced by the sample's matrix: 4 x 2 x (2048 + 2048) bytes; the sign-block deltas are wider
    low_rank = "delta:codec=sign-block,first=int4-block,grad=powersgd/rank=2"
    assert codec_link_bytes(low_rank, job, "pp").pp_inter == pytest.approx(1 / 8 + 4 / 128)
    assert codec_link_bytes("powersgd:rank=2", job, "pp").pp_inter == pytest.approx(8 * 4096 / 2048**2)
    with pytest.raises(CodecError, match="grad: topk-lowbit: bits must be one of"):
        DeltaSpec.of(CodecSpec.parse("delta:grad=topk-lowbit/bits=3"))


def test_a_rotated_sign_gradient_crosses_a_cut_rotated_per_row_and_is_priced_by_its_width():
    """1-bit gradients after a random rotation (issue #48's gradient at 1.25 bits): each row its own rotation key,
    the carrier as wide as the rotated-sign payload (sign-block's bytes and the 8-byte key)."""
    text = "delta:codec=sign-block,first=int4-block,grad=rotated-sign/stochastic=true"
    spec = CodecSpec.parse(text)
    sender, receiver = DeltaWire(spec), DeltaWire(spec)
    grad_codec = get_codec("rotated-sign", stochastic=True)
    sample = (96, 128)
    for side in (sender, receiver):
        side.memory.values.update({i: torch.zeros(sample) for i in (0, 1)})
        assert not side.begin_step([0, 1])
    hidden = torch.randn(2, *sample, requires_grad=True)
    carrier = sender.send(hidden)
    assert carrier.shape == (2, 1 + (96 * 128 // 8 + 4 * 96 + 8) // 4)
    carried = carrier.detach().requires_grad_()
    upstream = torch.randn(2, *sample, generator=torch.Generator().manual_seed(4))
    receiver.receive(carried, sample).backward(upstream)
    carrier.backward(carried.grad)
    assert torch.equal(hidden.grad, torch.stack([grad_codec.roundtrip(row)[0] for row in upstream]))
    keys = [int(grad_codec.encode(row).buffers["key"][0]) for row in upstream]
    assert keys[0] != keys[1]
    assert DeltaSpec.of(spec).steady_bytes_per_value(sample, 4) == (1536 + 384 + 8) / (96 * 128)
    # bf16 scales: a scale per 64 values at the bytes of one per 128 in fp32
    half = DeltaSpec.of(CodecSpec.parse(text.replace("stochastic=true", "block_size=64/scale_dtype=bf16")))
    assert half.steady_bytes_per_value(sample, 4) == (1536 + 2 * 192 + 8) / (96 * 128)
    # rotated trits: 5 a byte, fp32 scales per 128 values, the key: the carrier as wide as the gradient's payload
    trits = DeltaSpec.of(CodecSpec.parse(text.replace("rotated-sign/stochastic=true", "rotated-ternary")))
    assert trits.steady_bytes_per_value(sample, 4) == (2458 + 4 * 96 + 8) / (96 * 128)


def test_a_delta_spec_is_checked_and_its_state_is_capped():
    with pytest.raises(CodecError, match="grad must be one of"):
        DeltaSpec.of(CodecSpec.parse("delta:grad=topk"))
    with pytest.raises(CodecError, match="unknown parameter 'bits'"):
        DeltaSpec.of(CodecSpec.parse("delta:bits=2"))
    spec = DeltaSpec.of(CodecSpec.parse("delta:max_state_mb=100"))
    assert delta_memory_refusal(spec, 2000, (96, 128)) is None  # 2,000 x 49,152 bytes = 98 MB
    assert delta_memory_refusal(spec, 3876, (96, 128)) == (
        "per-sample activation state of 3,876 samples x 49,152 bytes = 191 MB per side exceeds max_state_mb=100 "
        "(fewer samples: --epoch-windows N, or a larger max_state_mb)")
    # priced by its steady state: the wider of the delta and gradient payloads, each way
    assert spec.steady_bytes_per_value((96, 128), 4) == get_codec("int2-block").bytes_per_value(128, 4)
    wide_grad = DeltaSpec.of(CodecSpec.parse("delta:grad=int4-block"))
    assert wide_grad.steady_bytes_per_value((96, 128), 4) == get_codec("int4-block").bytes_per_value(128, 4)
    from geotrain.cost.codec_choice import codec_link_bytes
    from geotrain.job import JOB_PRESETS

    job = JOB_PRESETS["gpt-1.3b-seed"]  # the planner's price of a cut: the steady state
    assert codec_link_bytes("delta:codec=int2-block,grad=int2-block", job, "pp").pp_inter == pytest.approx(0.28125)


def test_epoch_windows_visit_every_window_once_per_epoch():
    ids = np.concatenate([window_ids(3, step, 96 * 20 + 1, 96, 8, "epochs") for step in range(5)])  # 20 windows
    assert sorted(ids[:20]) == list(range(20)) and sorted(ids[20:40]) == list(range(20))
    assert not np.array_equal(ids[:20], ids[20:40])  # each epoch in its own order
    assert np.array_equal(ids[:8], window_ids(3, 0, 96 * 20 + 1, 96, 8, "epochs"))  # a pure function of the step
    assert sorted(window_ids(0, 0, 10_000, 96, 8, "epochs", limit=8)) == list(range(8))


def test_settings_without_a_sample_identity_or_a_lasting_state_are_refused_in_one_line(tmp_path):
    from geotrain.bench.pipeline import bench_cluster
    from geotrain.runtime import RuntimeConfig, RuntimeConfigError

    cut = {"cluster": bench_cluster(), "pp_codec": "delta", "steps": 2}
    RuntimeConfig.of(assignment=[[0], [2]], windows="epochs", **cut)  # runs
    RuntimeConfig.of(assignment=[[0], [2]], windows="epochs", checkpoint_dir=str(tmp_path), **cut)  # its state saved
    refusals = [
        ({"assignment": [[0], [2]]}, "--pp-codec delta with --windows random: every start offset is a sample, seen "
                                     "about once, so per-sample deltas never start; use --windows epochs"),
        ({"assignment": [[0], [1], [2]], "windows": "epochs"},
         "--pp-codec delta with 3 stages of 1 virtual stages each: not built yet: one cut"),
    ]
    for settings_, line in refusals:
        with pytest.raises(RuntimeConfigError, match=re.escape(line)) as found:
            RuntimeConfig.of(**settings_, **cut)
        assert "\n" not in str(found.value)


FEEDBACK = CodecSpec.parse("delta:codec=sign-block,first=int4-block,grad=sign-block,feedback=true")


def _backward(sender: DeltaWire, receiver: DeltaWire, ids: list[int], upstream: torch.Tensor) -> torch.Tensor:
    """One micro-batch forward and back across the cut: the activation gradient the sender decodes."""
    for side in (sender, receiver):
        side.begin_step(ids)
    hidden = torch.randn(len(ids), *SAMPLE, requires_grad=True)
    carrier = sender.send(hidden)
    carried = carrier.detach().requires_grad_()
    receiver.receive(carried, SAMPLE).backward(upstream)
    carrier.backward(carried.grad)
    return hidden.grad


@settings(max_examples=20, deadline=None)
@given(steps=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True), min_size=1, max_size=6),
       seed=st.integers(0, 2**16))
def test_gradient_feedback_loses_nothing_per_sample_only_delays_it(steps, seed):
    """With feedback=true, what the sender has received of a sample's gradients plus the receiver's residual of
    that sample is the sum of the sample's gradients (EF: nothing lost, only delayed to the sample's next visit);
    the bytes are the grad codec's, as without feedback."""
    sender, receiver = DeltaWire(FEEDBACK), DeltaWire(FEEDBACK)
    generator = torch.Generator().manual_seed(seed)
    sent: dict[int, torch.Tensor] = {}
    true: dict[int, torch.Tensor] = {}
    for ids in steps:
        upstream = torch.randn(len(ids), *SAMPLE, generator=generator)
        got = _backward(sender, receiver, ids, upstream)
        for row, i in enumerate(ids):
            sent[i] = sent.get(i, 0) + got[row].double()
            true[i] = true.get(i, 0) + upstream[row].double()
    assert receiver.residuals.values.keys() == true.keys() and not sender.residuals.values
    for i in true:
        assert torch.allclose(sent[i] + receiver.residuals.values[i].double(), true[i], atol=1e-4)
    plain = DeltaSpec.of(CodecSpec.parse(str(FEEDBACK).replace(",feedback=true", "")))
    assert DeltaSpec.of(FEEDBACK).steady_bytes_per_value((96, 128), 4) == plain.steady_bytes_per_value((96, 128), 4)


def test_gradient_feedback_corrects_the_second_visit_by_the_first_ones_error():
    sender, receiver = DeltaWire(FEEDBACK), DeltaWire(FEEDBACK)
    upstream = torch.randn(1, *SAMPLE, generator=torch.Generator().manual_seed(5))
    sign_block = get_codec("sign-block")
    first = _backward(sender, receiver, [2], upstream)
    assert torch.equal(first, sign_block.roundtrip(upstream[0])[0].unsqueeze(0))  # the first visit: no residual yet
    second = _backward(sender, receiver, [2], upstream)
    corrected = upstream[0] + (upstream[0] - first[0])
    assert torch.equal(second[0], sign_block.roundtrip(corrected)[0])
    plain = DeltaWire(CodecSpec.parse(str(FEEDBACK).replace(",feedback=true", "")))
    plain_sender = DeltaWire(plain.spec)
    _backward(plain_sender, plain, [2], upstream)
    assert torch.equal(_backward(plain_sender, plain, [2], upstream), first) and not plain.residuals.values


def test_a_wire_with_feedback_saved_and_loaded_carries_on_as_the_one_that_was_not():
    sender, receiver = DeltaWire(FEEDBACK), DeltaWire(FEEDBACK)
    generator = torch.Generator().manual_seed(6)
    _backward(sender, receiver, [4, 0], torch.randn(2, *SAMPLE, generator=generator))
    state = receiver.state_dict()
    assert state["residual_ids"].tolist() == [0, 4] and state["ids"].tolist() == [0, 4]
    loaded, loaded_sender = DeltaWire(FEEDBACK), DeltaWire(FEEDBACK)
    loaded.load_state_dict(state)
    loaded_sender.load_state_dict(sender.state_dict())
    upstream = torch.randn(2, *SAMPLE, generator=generator)
    assert torch.equal(_backward(loaded_sender, loaded, [0, 4], upstream), _backward(sender, receiver, [0, 4], upstream))
    with pytest.raises(KeyError):
        DeltaWire(FEEDBACK).load_state_dict(DeltaWire(SPEC).state_dict())  # a shard written without feedback
    with pytest.raises(CodecError, match="feedback must be a boolean"):
        DeltaSpec.of(CodecSpec.parse("delta:feedback=maybe"))
    spec = DeltaSpec.of(CodecSpec.parse("delta:max_state_mb=100,feedback=true"))  # the residuals double the state
    assert delta_memory_refusal(spec, 1000, (96, 128)) is None
    assert "2,000 samples x 98,304 bytes" in delta_memory_refusal(spec, 2000, (96, 128))
