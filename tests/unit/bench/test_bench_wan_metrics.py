"""bench wan's derived figures (geotrain.bench.wan_metrics) on synthetic per-step records."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.bench.wan import DEFAULT_ROWS, LIMIT_ROW, WAN_CLUSTER
from geotrain.bench.wan_metrics import (compute_fraction, emulated_step_seconds, limit_fraction,
                                        peak_inter_region_gbps, peak_profile, zero_cost_links)
from geotrain.bench.wan_rows import WanBenchError
from geotrain.cluster import load_cluster


def _record(step: int, rank: int, compute_s: float, inter_bytes: float = 0.0, span: tuple[float, float] = (0.0, 0.0),
            wire: list[list[float]] | None = None) -> dict:
    emulated = {"start_s": span[0], "end_s": span[1], "bytes": inter_bytes, "inter_region_bytes": inter_bytes}
    if wire is not None:
        emulated["inter_region_wire"] = wire
    return {"step": step, "rank": rank, "compute_s": compute_s, "emulated": emulated}


def _steps(step_s: float, steps: int) -> tuple[float, float]:
    return [(s * step_s, (s + 1) * step_s) for s in range(steps)]


def test_limit_fraction_is_the_ratio_to_the_limit_rows_time_and_none_when_missed():
    assert limit_fraction(30.0, 12.0) == pytest.approx(2.5)
    assert limit_fraction(None, 12.0) is None and limit_fraction(30.0, None) is None


def test_compute_fraction_averages_devices_over_steady_steps_and_caps_at_one():
    seconds = np.array([9.0, 2.0, 2.0])  # step 0 is left out, as in the step times
    records = [_record(s, 0, c) for s, c in enumerate([9.0, 1.0, 1.0])]  # 2 of 4 s: 0.5
    records += [_record(s, 1, c) for s, c in enumerate([0.0, 3.0, 2.0])]  # 5 of 4 s: capped at 1
    assert compute_fraction(records, seconds) == pytest.approx(0.75)
    assert compute_fraction([_record(0, 0, 0.5)], np.array([2.0])) == pytest.approx(0.25)  # one step: that one


def test_step_seconds_use_the_slowest_rank_and_skip_time_between_steps():
    records = [_record(0, 0, 0, span=(0.0, 1.0)), _record(0, 1, 0, span=(0.0, 1.5)),   # step 0: slowest ends at 1.5
               _record(1, 0, 0, span=(1.0, 2.5)), _record(1, 1, 0, span=(1.5, 3.0)),   # continuous: 3.0 - 1.5
               _record(2, 0, 0, span=(5.0, 6.0)), _record(2, 1, 0, span=(5.2, 6.5))]   # a checkpoint until 5.2
    seconds = emulated_step_seconds(records, 3)
    assert seconds[1:].tolist() == pytest.approx([1.5, 1.3])
    assert seconds[0] == pytest.approx(1.4)  # step 0 counts as the mean of the others
    with pytest.raises(WanBenchError, match="not emulated"):
        emulated_step_seconds([{"step": 0, "emulated": None}], 1)


def test_records_without_wire_times_spread_each_steps_bytes_over_the_step():
    # steps of 0.5 s; 100 MB in step 2 only, (ranks add up): the best 1 s window holds all of it
    spans = _steps(0.5, 6)
    seconds = np.full(6, 0.5)
    records = [_record(s, r, 0.1, 50e6 if s == 2 else 0.0, spans[s]) for s in range(6) for r in range(2)]
    assert peak_inter_region_gbps(records, seconds) == pytest.approx(100e6 * 8 / 1e9)
    # evenly spread traffic: the peak is the mean rate, whatever the window
    flat = [_record(s, 0, 0.1, 1e6, spans[s]) for s in range(6)]
    assert peak_inter_region_gbps(flat, seconds) == pytest.approx(1e6 * 8 / 1e9 / 0.5)
    assert peak_inter_region_gbps(flat, seconds, window_s=0.1) == pytest.approx(1e6 * 8 / 1e9 / 0.5)
    # a run shorter than the window: its mean rate over the run
    assert peak_inter_region_gbps([_record(0, 0, 0.1, 1e6, (0.0, 0.25))], np.array([0.25])) == \
        pytest.approx(1e6 * 8 / 1e9 / 0.25)


def test_a_messages_bytes_count_while_it_is_on_its_link():
    # 0.5 s steps; in step 2 ([1.0, 1.5] on the clock) one 10 MB message on the wire from 1.0 to 1.1
    spans = _steps(0.5, 4)
    records = [_record(s, 0, 0.1, 10e6 if s == 2 else 0.0, spans[s], [[1.0, 1.1, 10e6]] if s == 2 else [])
               for s in range(4)]
    profile = peak_profile(records, np.full(4, 0.5), (0.05, 0.1, 1.0))
    assert profile == pytest.approx({0.05: 10e6 * 8 / 1e9 / 0.1, 0.1: 10e6 * 8 / 1e9 / 0.1, 1.0: 10e6 * 8 / 1e9})
    # spread over its step (no wire times), the same bytes demand a fifth of that rate at 0.1 s
    spread = [_record(s, 0, 0.1, 10e6 if s == 2 else 0.0, spans[s]) for s in range(4)]
    assert peak_inter_region_gbps(spread, np.full(4, 0.5), 0.1) == pytest.approx(10e6 * 8 / 1e9 / 0.5)


def test_time_between_steps_is_left_out_of_the_timeline():
    # step 1 ends at 1.0 on the clock, step 2 begins at 3.0 (a checkpoint between): 5 MB leave in the last
    # 0.1 s of step 1 and 5 MB in the first 0.1 s of step 2, adjacent on the row's timeline
    spans = [(0.0, 0.5), (0.5, 1.0), (3.0, 3.5)]
    records = [_record(0, 0, 0.1, 0.0, spans[0], []), _record(1, 0, 0.1, 5e6, spans[1], [[0.9, 1.0, 5e6]]),
               _record(2, 0, 0.1, 5e6, spans[2], [[3.0, 3.1, 5e6]])]
    assert peak_inter_region_gbps(records, np.full(3, 0.5), 0.2) == pytest.approx(10e6 * 8 / 1e9 / 0.2)


def test_a_message_on_a_free_link_counts_at_once():
    records = [_record(0, 0, 0.1, 1e6, (0.0, 1.0), [[0.5, 0.5, 1e6]])]
    assert peak_inter_region_gbps(records, np.array([1.0]), 0.01) == pytest.approx(1e6 * 8 / 1e9 / 0.01)


def test_zero_cost_links_keep_the_devices_and_free_every_link():
    cluster = load_cluster(WAN_CLUSTER)
    free = zero_cost_links(cluster)
    off = ~np.eye(cluster.n_devices, dtype=bool)
    assert free.n_devices == cluster.n_devices and np.array_equal(free.region_of, cluster.region_of)
    assert np.all(free.latency_ms == 0) and np.all(free.bandwidth_gbps[off] >= 1e6)


def test_the_limit_row_is_the_fp32_baseline_on_free_links():
    limit, baseline = DEFAULT_ROWS[LIMIT_ROW], DEFAULT_ROWS[0]
    assert "limit" in limit.label and limit.free_links and not baseline.free_links
    assert (limit.placement, limit.dp_codec, limit.pp_codec, limit.options) == \
        (baseline.placement, baseline.dp_codec, baseline.pp_codec, baseline.options)
    streaming = [row for row in DEFAULT_ROWS if dict(row.options).get("fragments", 1) > 1]
    assert len(streaming) == 2 and {row.dp_codec for row in streaming} == {"int4-block"}
    # fragments cut between tensors (the default) and at equal bytes, otherwise the same row
    assert [dict(row.options).get("fragment_split", "layers") for row in streaming] == ["layers", "bytes"]
    assert dict(streaming[0].options) == {k: v for k, v in streaming[1].options if k != "fragment_split"}
    # their reference: the same row with one fragment (the peak rates docs/history/wan.md compares)
    reference = [row for row in DEFAULT_ROWS if "streaming row's reference" in row.label]
    assert len(reference) == 1 and reference[0].dp_codec == streaming[0].dp_codec
    assert dict(reference[0].options) == {k: v for k, v in streaming[0].options if k != "fragments"}
