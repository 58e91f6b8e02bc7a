"""CodecSpec: the typed codec spec, parsed once; its text form parses back to an equal spec."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from geotrain.codecs import CODECS, CodecError, CodecSpec, get_codec

names = st.sampled_from(sorted(CODECS))
keys = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True)
values = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False, width=32),
                   st.booleans(), st.from_regex(r"[a-z][a-z0-9_.-]{0,8}", fullmatch=True))


@given(names, st.dictionaries(keys, values, max_size=4))
def test_text_form_parses_back_to_an_equal_spec(name, params):
    spec = CodecSpec(name, tuple(params.items()))
    assert CodecSpec.parse(str(spec)) == spec


@given(names, st.dictionaries(keys, values, max_size=4))
def test_a_nested_spec_survives_its_own_text_and_an_outer_specs(name, params):
    spec = CodecSpec(name, tuple(params.items()))
    assert CodecSpec.parse_nested(spec.nested()) == spec
    outer = CodecSpec.parse(str(CodecSpec("delta", (("grad", spec.nested()), ("first", "int8-block")))))
    assert len(outer.params) == 2 and CodecSpec.parse_nested(outer.kwargs()["grad"]) == spec  # no item split


def test_a_nested_spec_reads_slashes_or_a_colon_and_refuses_commas():
    want = CodecSpec("topk-lowbit", (("fraction", 0.0625), ("bits", 4)))
    assert CodecSpec.parse_nested("topk-lowbit/fraction=0.0625/bits=4") == want
    assert CodecSpec.parse_nested("topk-lowbit:fraction=0.0625/bits=4") == want
    assert CodecSpec.parse_nested("int2-block") == CodecSpec("int2-block")
    with pytest.raises(CodecError, match="no commas"):
        CodecSpec.parse_nested("topk-lowbit:fraction=0.0625,bits=4")


def test_parse_reads_names_and_typed_values():
    spec = CodecSpec.parse("topk:fraction=0.01,value_dtype=fp16")
    assert spec == CodecSpec("topk", (("fraction", 0.01), ("value_dtype", "fp16")))
    assert spec.kwargs() == {"fraction": 0.01, "value_dtype": "fp16"}
    assert CodecSpec.parse(spec) is spec
    assert str(CodecSpec.parse("none")) == "none"


def test_build_checks_the_codec_and_its_parameters():
    assert CodecSpec.parse("int8-block:block_size=64").build().params()["block_size"] == 64
    with pytest.raises(CodecError, match="no parameter"):
        CodecSpec.parse("topk:rank=3").build()
    with pytest.raises(CodecError, match="unknown codec"):
        CodecSpec.parse("zip").build()


def test_codec_facts_are_properties_of_the_codec():
    assert {name for name, cls in CODECS.items() if cls.wire_float_dtype is not None} == {"none", "fp16", "bf16"}
    assert get_codec("bf16").wire_float_dtype is torch.bfloat16
    assert get_codec("powersgd").latency_rounds == 2.0
    assert get_codec("sign").latency_rounds == 1.0
    assert get_codec("fp16").summable and not get_codec("int8-block").summable


def test_uncompressed_spec_is_the_none_codec_whatever_its_parameters():
    assert CodecSpec.uncompressed() == CodecSpec.parse("none") and CodecSpec.uncompressed().is_uncompressed
    assert CodecSpec.parse("none:allow_nonfinite=true").is_uncompressed
    assert not CodecSpec.parse("fp16").is_uncompressed
