"""bench chaos: goodput is useful samples per second relative to the reference row; bad options refused."""

from __future__ import annotations

import pytest

from geotrain.bench.chaos import ChaosBenchConfig, ChaosBenchError, goodput


def test_goodput_is_samples_per_second_relative_to_the_reference():
    assert goodput(6400, 80.0, 6400, 80.0) == 1.0
    assert goodput(6400, 100.0, 6400, 80.0) == pytest.approx(0.8)
    assert goodput(3200, 40.0, 6400, 100.0) == pytest.approx(1.25)


@pytest.mark.parametrize("key", ["steps", "batch_size", "seq_len", "checkpoint_every", "kills"])
def test_counts_below_one_are_refused_naming_the_option(key):
    with pytest.raises(ChaosBenchError, match=f"{key} must be an integer >= 1"):
        ChaosBenchConfig(**{key: 0})
