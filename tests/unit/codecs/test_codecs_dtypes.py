"""Codec facts that used to be name tables elsewhere: float dtypes by name, wire float dtypes, bytes
per value for cost models."""

from __future__ import annotations

import pytest
import torch

from geotrain.codecs import CODECS, CodecError, get_codec
from geotrain.codecs.dtypes import FLOAT_DTYPES, float_dtype, itemsize
from geotrain.comm.hierarchical import expected_link_bytes
from geotrain.comm.regions import RegionsError


def test_float_dtype_reads_names_and_refuses_others_naming_the_source():
    assert [float_dtype(name, "x") for name in ("fp32", "fp16", "bf16")] == [torch.float32, torch.float16,
                                                                            torch.bfloat16]
    assert [itemsize(d) for d in FLOAT_DTYPES.values()] == [4, 2, 2]
    with pytest.raises(CodecError, match=r"^topk: value_dtype must be one of fp16, fp32, got 'bf16'$"):
        float_dtype("bf16", "topk: value_dtype", ("fp16", "fp32"))


def test_codec_value_and_intra_dtypes_go_through_the_one_table():
    assert get_codec("topk", value_dtype="fp16").wire_nbytes((1000,)) == 10 * (4 + 2)
    with pytest.raises(CodecError, match="value_dtype must be one of"):
        get_codec("topk", value_dtype="bf16")
    from geotrain.comm.hierarchical import HierarchicalGroups, HierarchicalReducer
    from geotrain.comm.regions import Regions

    groups = HierarchicalGroups(Regions.of([[0, 1]]), 2, (object(),), {})
    assert expected_link_bytes(get_codec("sign"), groups, 0, 100, "bf16").intra_bytes == 2 * (50 + 50)
    with pytest.raises(RegionsError, match="intra_dtype must be one of fp32, fp16, bf16, got 'fp8'"):
        HierarchicalReducer(get_codec("sign"), groups, intra_dtype="fp8", rank=0)


def test_wire_float_dtype_is_set_exactly_for_the_cast_codecs():
    floats = {name: cls.wire_float_dtype for name, cls in CODECS.items() if cls.wire_float_dtype is not None}
    assert floats == {"none": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    from geotrain.runtime.sections import PP_CODECS

    from geotrain.codecs.carrier import CARRIED_CODECS

    # the pipeline's activation codecs: the casts (derived from the fact), then those a float32 carrier takes
    assert PP_CODECS == (*floats, *CARRIED_CODECS, "delta")


@pytest.mark.parametrize("name, trained, expected", [
    ("none", 2, 2.0), ("none", 8, 8.0), ("fp16", 4, 2.0), ("fp16", 2, 2.0), ("bf16", 1, 1.0),
    ("int8-block", 2, 1 + 4 / 256), ("sign", 2, 1 / 8 + 4 / 2**20),
])
def test_bytes_per_value_is_the_flat_wire_size_capped_at_the_trained_width(name, trained, expected):
    assert get_codec(name).bytes_per_value(768, trained) == pytest.approx(expected, rel=1e-12)


def test_powersgd_bytes_per_value_is_priced_on_the_h_by_4h_matrix():
    h, r = 768, 4
    assert get_codec("powersgd", rank=r).bytes_per_value(h, 2) == pytest.approx(4 * r * (h + 4 * h) / (4 * h * h))
