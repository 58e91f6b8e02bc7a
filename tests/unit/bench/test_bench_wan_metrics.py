"""bench wan's derived figures (geotrain.bench.wan_metrics) on synthetic per-step records."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.bench.wan import DEFAULT_ROWS, LIMIT_ROW, WAN_CLUSTER
from geotrain.bench.wan_metrics import compute_fraction, limit_fraction, peak_inter_region_gbps, zero_cost_links
from geotrain.cluster import load_cluster


def _record(step: int, rank: int, compute_s: float, inter_bytes: float = 0.0) -> dict:
    return {"step": step, "rank": rank, "compute_s": compute_s,
            "emulated": {"start_s": 0.0, "end_s": 0.0, "bytes": inter_bytes, "inter_region_bytes": inter_bytes}}


def test_limit_fraction_is_the_ratio_to_the_limit_rows_time_and_none_when_missed():
    assert limit_fraction(30.0, 12.0) == pytest.approx(2.5)
    assert limit_fraction(None, 12.0) is None and limit_fraction(30.0, None) is None


def test_compute_fraction_averages_devices_over_steady_steps_and_caps_at_one():
    seconds = np.array([9.0, 2.0, 2.0])  # step 0 is left out, as in the step times
    records = [_record(s, 0, c) for s, c in enumerate([9.0, 1.0, 1.0])]  # 2 of 4 s: 0.5
    records += [_record(s, 1, c) for s, c in enumerate([0.0, 3.0, 2.0])]  # 5 of 4 s: capped at 1
    assert compute_fraction(records, seconds) == pytest.approx(0.75)
    assert compute_fraction([_record(0, 0, 0.5)], np.array([2.0])) == pytest.approx(0.25)  # one step: that one


def test_peak_inter_region_rate_is_the_busiest_one_second_window():
    # steps of 0.5 s; 100 MB in step 2 only, (ranks add up): the best 1 s window holds all of it
    seconds = np.full(6, 0.5)
    records = [_record(s, r, 0.1, 50e6 if s == 2 else 0.0) for s in range(6) for r in range(2)]
    assert peak_inter_region_gbps(records, seconds) == pytest.approx(100e6 * 8 / 1e9)
    # evenly spread traffic: the peak is the mean rate, whatever the window
    flat = [_record(s, 0, 0.1, 1e6) for s in range(6)]
    assert peak_inter_region_gbps(flat, seconds) == pytest.approx(1e6 * 8 / 1e9 / 0.5)
    # a run shorter than the window: its mean rate over the run
    assert peak_inter_region_gbps([_record(0, 0, 0.1, 1e6)], np.array([0.25])) == pytest.approx(1e6 * 8 / 1e9 / 0.25)


def test_peak_window_straddling_two_steps_is_found():
    # 1 s steps: 10 MB, 30 MB, 30 MB, 10 MB: the best 1 s window is any inside steps 1-2 (30 MB)
    seconds = np.ones(4)
    records = [_record(s, 0, 0.1, b) for s, b in enumerate([10e6, 30e6, 30e6, 10e6])]
    assert peak_inter_region_gbps(records, seconds) == pytest.approx(30e6 * 8 / 1e9)
    # 0.5 s window over 1 s steps of 10 MB then 30 MB: inside the 30 MB step, 15 MB per 0.5 s
    assert peak_inter_region_gbps(records[:2], seconds[:2], window_s=0.5) == pytest.approx(15e6 * 8 / 1e9 / 0.5)


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
    assert len(streaming) == 1 and streaming[0].dp_codec == "int4-block"
