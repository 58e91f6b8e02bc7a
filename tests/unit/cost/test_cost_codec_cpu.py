"""geotrain.cost.codec_cpu: one outer sync's codec CPU, measured per value on this machine."""

from __future__ import annotations

import pytest

from geotrain.cost.codec_cpu import sync_codec_seconds_by_codec, sync_codec_seconds_per_value


def test_gathered_codecs_cost_cpu_a_summable_one_nothing_unless_moments_travel_with_it():
    seconds = sync_codec_seconds_by_codec(("none", "int8-block", "int4-block"), 4, sample=1 << 16)
    assert seconds["none"] == 0.0
    # tens of nanoseconds a value on a quiet core; the bound leaves room for a loaded machine (2.3 us seen
    # under the test suite's two workers: torch's threads' CPU counts too)
    assert 0 < seconds["int8-block"] < 1e-4 and 0 < seconds["int4-block"] < 1e-4
    assert sync_codec_seconds_per_value("none", 4, sync_moments=True, sample=1 << 16) > 0


def test_moment_sync_and_more_replicas_cost_more():
    # three tensors' codecs instead of one; more replicas' payloads to decode (medians of 5 against noise)
    def median(**kwargs):
        return sorted(sync_codec_seconds_per_value(sample=1 << 18, **kwargs) for _ in range(5))[2]

    assert median(codec="int4-block", replicas=4, sync_moments=True) > median(codec="int4-block", replicas=4)
    assert median(codec="int8-block", replicas=16) > median(codec="int8-block", replicas=1)


def test_it_times_one_torch_thread_and_restores_the_callers_count():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sync_codec_seconds_per_value("int8-block", 2, sample=1 << 12)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="replicas"):
        sync_codec_seconds_per_value("int8-block", 0)
