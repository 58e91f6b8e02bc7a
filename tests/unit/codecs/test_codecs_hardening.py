"""Codec hardening: no silent inf from finite input, malformed payloads refused, strict specs and flags,
hooks on a plain module refused with a clear error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geotrain.codecs import CODECS, CodecError, get_codec, pack_payload, parse_codec_spec, unpack_payload
from geotrain.errors import GeotrainError

FLOAT32_MAX = float(np.finfo(np.float32).max)


# ---- item 10: finite input never becomes inf silently ---------------------------------------------
@pytest.mark.parametrize("name", ["topk", "randk"])
@pytest.mark.parametrize("value_dtype", ["fp32", "fp16"])
def test_sparse_codecs_refuse_finite_float64_beyond_their_value_range(name, value_dtype):
    x = torch.tensor([1.0, 1e300, -2.0], dtype=torch.float64)
    with pytest.raises(CodecError, match="overflows the wire format"):
        get_codec(name, fraction=1.0, value_dtype=value_dtype).encode(x)


@pytest.mark.parametrize("name", sorted(CODECS))
@settings(max_examples=30, deadline=None)
@given(x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=9),
                    elements=st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False)),
       fraction=st.sampled_from([0.3, 1.0]))
def test_finite_input_decodes_to_finite_values_or_raises_codec_error(name, x, fraction):
    params = {"fraction": fraction} if name in ("topk", "randk") else {}
    codec = get_codec(name, **params)
    tensor = torch.from_numpy(x)
    try:
        restored = codec.decode(codec.encode(tensor))
    except CodecError as error:
        assert "overflows the wire format" in str(error)
        assert float(tensor.abs().max()) > 65504  # only values beyond a wire format's range are refused
        return
    assert bool(torch.isfinite(restored).all())
    if name in ("topk", "randk"):  # every value sent is represented exactly (as fp32)
        sent = restored != 0
        assert torch.equal(restored[sent], tensor.to(torch.float32).to(torch.float64)[sent])


# ---- item 11: malformed payloads raise CodecError --------------------------------------------------
def _replace(payload, **buffers):
    return dataclasses.replace(payload, buffers={**payload.buffers, **buffers})


def test_topk_refuses_negative_and_out_of_range_indices():
    codec = get_codec("topk", fraction=0.5)
    payload = codec.encode(torch.arange(1.0, 9.0))
    for bad in (-1, 8, 2**31 - 1):
        indices = payload.buffers["indices"].clone()
        indices[0] = bad
        with pytest.raises(CodecError, match=r"indices must lie in 0..7, got"):
            codec.decode(_replace(payload, indices=indices))


def test_int8_block_refuses_too_few_scales_and_block_size_zero():
    codec = get_codec("int8-block", block_size=4)
    payload = codec.encode(torch.randn(10))
    with pytest.raises(CodecError, match=r"buffer 'scales' must be torch.float32 of shape \(3,\), got .* \(2,\)"):
        codec.decode(_replace(payload, scales=payload.buffers["scales"][:2]))
    for block in (0, -4, 2.5, "4", None, 2**70):
        with pytest.raises(CodecError, match="'int8-block' payload meta 'block_size' must be"):
            codec.decode(dataclasses.replace(payload, meta={"block_size": block}))


def test_sign_refuses_too_few_bytes_and_int8_a_missing_scale():
    sign = get_codec("sign")
    payload = sign.encode(torch.randn(100))
    with pytest.raises(CodecError, match=r"buffer 'bits' must be torch.uint8 of shape \(13,\), "
                                         r"got torch.uint8 of shape \(1,\)"):
        sign.decode(_replace(payload, bits=payload.buffers["bits"][:1]))
    int8 = get_codec("int8")
    payload = int8.encode(torch.randn(5))
    with pytest.raises(CodecError, match=r"buffer 'scales' must be torch.float32 of shape \(1,\)"):
        int8.decode(_replace(payload, scales=torch.empty(0)))


@pytest.mark.parametrize("name", sorted(CODECS))
def test_every_codec_refuses_wrong_dtypes_lengths_missing_and_extra_buffers(name):
    codec = get_codec(name)
    payload = codec.encode(torch.randn(6, 40))
    for key, tensor in payload.buffers.items():
        for bad in (tensor.reshape(-1)[:-1], torch.cat([tensor.reshape(-1), tensor.reshape(-1)[:1]]),
                    tensor.to(torch.float64), None):
            with pytest.raises(CodecError):
                codec.decode(_replace(payload, **{key: bad}))
        with pytest.raises(CodecError, match="payload must carry buffers"):
            codec.decode(dataclasses.replace(payload, buffers={k: v for k, v in payload.buffers.items() if k != key}))
    with pytest.raises(CodecError, match="payload must carry buffers"):
        codec.decode(_replace(payload, extra=torch.zeros(2)))
    # A sparse payload fits any shape with at least k values: (6, 41) is malformed for the dense ones only.
    dense = (6, 41) if name not in ("topk", "randk", "topk-lowbit") else (0, 40)
    for shape in ((-6, -40), (6.0, 40), "6x40", dense, (2**31, 2**31)):
        with pytest.raises(CodecError):
            codec.decode(dataclasses.replace(payload, shape=shape))
    with pytest.raises(CodecError, match="dtype must be one of"):
        codec.decode(dataclasses.replace(payload, dtype=torch.int32))


def test_randk_refuses_bad_step_seed_and_a_k_of_another_fraction():
    codec = get_codec("randk", fraction=0.25)
    payload = codec.encode(torch.randn(40))
    for key, value in (("step", -1), ("step", 1.5), ("seed", "0"), ("seed", 2**64)):
        with pytest.raises(CodecError, match=f"'randk' payload meta '{key}'"):
            codec.decode(dataclasses.replace(payload, meta={**payload.meta, key: value}))
    with pytest.raises(CodecError, match=r"keeps k=4: encode and decode with one fraction"):
        get_codec("randk", fraction=0.1).decode(payload)


def test_powersgd_refuses_factors_of_the_wrong_rank_or_shape():
    codec = get_codec("powersgd", rank=2)
    payload = codec.encode(torch.randn(20, 30))
    with pytest.raises(CodecError, match=r"buffer 'q' must be torch.float32 of shape \(30, 2\)"):
        codec.decode(_replace(payload, q=payload.buffers["q"][:29]))
    with pytest.raises(CodecError, match=r"'powersgd' payload meta 'rank' must be <= 20"):
        codec.decode(dataclasses.replace(payload, meta={"rank": 21, "step": 0}))


def test_unpack_refuses_a_spec_with_negative_or_repeated_buffers():
    codec = get_codec("int8")
    payload = codec.encode(torch.randn(8))
    data, spec = pack_payload(payload), payload.spec()
    bad = dataclasses.replace(spec, buffers=(dataclasses.replace(spec.buffers[0], shape=(-1, -8)), spec.buffers[1]))
    with pytest.raises(CodecError, match="buffer 'codes' shape"):
        unpack_payload(data, bad)
    with pytest.raises(CodecError, match="distinct names"):
        unpack_payload(data, dataclasses.replace(spec, buffers=(spec.buffers[0], spec.buffers[0])))
    with pytest.raises(CodecError, match="1-D uint8 tensor, got bytes"):
        unpack_payload(bytes(12), spec)


# ---- items 20 and 23: specs parsed strictly ---------------------------------------------------------
@pytest.mark.parametrize("text,value", [("true", True), ("False", False), ("yes", True), ("NO", False),
                                        ("1", True), ("0", False), (" yes ", True)])
def test_codec_flags_parse_strictly(text, value):
    name, params = parse_codec_spec(f"fp16:allow_nonfinite={text}")
    assert params == {"allow_nonfinite": value} and type(params["allow_nonfinite"]) is bool
    assert get_codec(name, **params).allow_nonfinite is value


@pytest.mark.parametrize("text", ["maybe", "2", "-1", "none", "", "0.0", "tru"])
def test_codec_flags_refuse_anything_else(text):
    with pytest.raises(CodecError, match=r"allow_nonfinite must be a boolean \(true/false, yes/no, 1/0\)"):
        parse_codec_spec(f"topk:allow_nonfinite={text}")


@pytest.mark.parametrize("value", ["no", "maybe", 2, 0.0, None])
def test_codec_constructors_never_coerce_flags_with_bool(value):
    if value == "no":
        assert get_codec("sign", allow_nonfinite=value).allow_nonfinite is False  # bool("no") would be True
    else:
        with pytest.raises(CodecError, match="allow_nonfinite must be a boolean"):
            get_codec("sign", allow_nonfinite=value)


@pytest.mark.parametrize("spec,message", [
    ("topk:fraction=0.5,fraction=0.1", r"parameter 'fraction' given twice"),
    ("topk:fraction=0.5, fraction =0.1", r"parameter 'fraction' given twice"),
    ("topk:fraction", r"parameter 'fraction' must look like key=value"),
    ("topk:=0.1", r"must look like key=value"),
    (":fraction=0.1", r"missing codec name"),
    ("topk:" + "x=1," * 400, r"at most 1000 characters"),
])
def test_malformed_codec_specs_are_refused(spec, message):
    with pytest.raises(CodecError, match=message):
        parse_codec_spec(spec)


def test_codec_specs_keep_types_for_the_codec_to_check():
    assert parse_codec_spec("topk:fraction=0.1,value_dtype=fp16,") == ("topk", {"fraction": 0.1, "value_dtype": "fp16"})
    name, params = parse_codec_spec("int8-block:block_size=2.0")
    with pytest.raises(CodecError, match="block_size must be an integer >= 1, got 2.0"):
        get_codec(name, **params)  # not coerced to 2


def test_powersgd_config_flags_are_strict():
    from geotrain.comm import PowerSGDConfig

    assert PowerSGDConfig(error_feedback="no").error_feedback is False
    with pytest.raises(CodecError, match="powersgd: allow_nonfinite must be a boolean"):
        PowerSGDConfig(allow_nonfinite="sometimes")


# ---- item 24: hooks need a DDP model ----------------------------------------------------------------
@pytest.mark.parametrize("codec", ["fp16", "topk", "powersgd"])
def test_registering_a_hook_on_a_plain_module_is_a_clear_error(codec):
    from geotrain.ddp.hooks import register_codec_hook

    with pytest.raises(GeotrainError, match=r"register_codec_hook needs a torch.nn.parallel.DistributedDataParallel "
                                            r"model, got Linear \(wrap it: DistributedDataParallel\(model\)") as info:
        register_codec_hook(torch.nn.Linear(3, 2), codec)
    assert isinstance(info.value, TypeError)


def test_registering_the_powersgd_hook_on_a_plain_module_is_a_clear_error():
    from geotrain.ddp.hooks import register_codec_hook

    with pytest.raises(GeotrainError, match="register_codec_hook needs a torch.nn.parallel.DistributedDataParallel"):
        register_codec_hook(torch.nn.Sequential(torch.nn.Linear(3, 2)), "powersgd", rank=2)
    with pytest.raises(GeotrainError, match="got dict$"):
        register_codec_hook({}, "powersgd")


def test_hook_and_reducer_states_refuse_a_fractional_iteration():
    from geotrain.comm import PowerSGDConfig, PowerSGDLayout, PowerSGDReducer

    config = PowerSGDConfig(rank=2)
    reducer = PowerSGDReducer(PowerSGDLayout.build([("w", (8, 8))], config), config, 1)
    state = reducer.state_dict()
    for bad in (1.7, "3", -1):
        with pytest.raises(CodecError, match="powersgd state: iteration must be an integer >= 0"):
            reducer.load_state_dict({**state, "iteration": bad})
