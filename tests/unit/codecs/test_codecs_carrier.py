"""Packed payloads in float32 carriers (codecs/carrier.py) and the sign-block codec."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.codecs import CODECS, get_codec, pack_payload
from geotrain.codecs.carrier import (
    CARRIED_CODECS,
    carried_spec,
    carrier_numel,
    decode_from_carrier,
    encode_to_carrier,
)


def test_carried_codecs_are_registered_and_not_casts():
    assert set(CARRIED_CODECS) <= set(CODECS)
    assert all(CODECS[name].wire_float_dtype is None for name in CARRIED_CODECS)


@pytest.mark.parametrize("name", CARRIED_CODECS)
def test_a_carried_codecs_payload_layout_depends_on_the_shape_alone(name):
    codec = get_codec(name)
    generator = torch.Generator().manual_seed(1)
    shape = (7, 48)
    specs = [codec.encode(x).spec() for x in (torch.zeros(shape), torch.randn(shape, generator=generator) * 1e3,
                                               -torch.rand(shape, generator=generator))]
    assert all(spec == carried_spec(codec, shape) for spec in specs)


@pytest.mark.parametrize("name", CARRIED_CODECS)
def test_carrier_rows_hold_each_samples_payload_bit_for_bit(name):
    codec = get_codec(name)
    x = torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(2))
    carrier = encode_to_carrier(codec, x)
    width = carrier_numel(codec, (5, 40))
    assert carrier.dtype == torch.float32 and carrier.shape == (3, width)
    assert width == math.ceil(codec.wire_nbytes((5, 40)) / 4)
    spec = carried_spec(codec, (5, 40))
    for b in range(3):
        packed = pack_payload(codec.encode(x[b]))
        row = carrier[b].view(torch.uint8)
        assert torch.equal(row[:packed.numel()], packed) and not row[packed.numel():].any()  # zero padding
    sent = carrier.clone()  # what a link does to it: copy the bytes
    restored = decode_from_carrier(codec, sent, spec)
    expected = torch.stack([codec.decode(codec.encode(x[b])) for b in range(3)])
    assert torch.equal(restored, expected)


@settings(max_examples=25, deadline=None)
@given(st.binary(min_size=4, max_size=64).filter(lambda b: len(b) % 4 == 0))
def test_any_bytes_survive_a_float32_tensor_copy(data):
    """The carrier is only copied: NaN payloads and denormals keep their bits."""
    carrier = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(torch.float32)
    assert bytes(carrier.clone().contiguous().view(torch.uint8).numpy()) == data
    assert bytes(carrier.to(torch.float32).view(torch.uint8).numpy()) == data


def test_sign_block_sends_each_blocks_mean_magnitude_with_the_sign():
    x = torch.tensor([1.0, -3.0, 2.0, 10.0, -20.0, 0.5, 0.0])
    codec = get_codec("sign-block", block_size=3)
    payload = codec.encode(x)
    assert payload.buffers["scales"].tolist() == pytest.approx([2.0, 30.5 / 3, 0.0])
    assert codec.decode(payload).tolist() == pytest.approx([2.0, -2.0, 2.0, 30.5 / 3, -30.5 / 3, 30.5 / 3, 0.0])
    assert payload.nbytes == codec.wire_nbytes((7,)) == 1 + 4 * 3
    one = get_codec("sign").decode(get_codec("sign").encode(x))
    assert float((codec.decode(payload) - x).norm()) < float((one - x).norm())  # blocks beat one scale here
