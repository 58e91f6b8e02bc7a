"""`geotrain bench wan`: emulated step accounting, row availability, and a tiny end-to-end run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from geotrain.bench.wan import (DEFAULT_ROWS, WAN_CLUSTER, bench_cluster, WanBenchConfig, WanRow, _row_available,
                                WanBenchError, model_job, planned_layouts)
from geotrain.cluster import load_cluster
from paths import ROOT

DATA = ROOT / "tests" / "data"


def test_rows_needing_fields_this_runtime_lacks_are_skipped_with_the_reason():
    assert _row_available(WanRow("plain")) is None
    assert "no field no_such_field" in _row_available(WanRow("x", options=(("no_such_field", 1),)))
    assert DEFAULT_ROWS[0].placement == "naive" and DEFAULT_ROWS[0].dp_codec == "none"


def test_wan_cluster_is_slow_between_regions_and_the_planner_keeps_fp32_on_fast_groups():
    cluster = load_cluster(WAN_CLUSTER)
    inter = cluster.region_of[:, None] != cluster.region_of[None, :]
    assert cluster.n_regions == 4 and np.all(cluster.bandwidth_gbps[inter] == 0.1)
    assert 50 <= cluster.latency_ms[inter].min() and cluster.latency_ms[inter].max() <= 150
    layouts = planned_layouts(cluster, model_job(32), WanBenchConfig())
    assert set(layouts) == {"1x4", "2x2", "4x1"}
    for layout in layouts.values():
        assert layout.choice.cost["total"] <= layout.cost_s
        regions = cluster.region_of[layout.assignment]
        for stage, codec in enumerate(layout.choice.dp):
            if len(set(regions[stage])) == 1:
                assert codec == "none"  # a DP group inside one region is never compressed


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_wan_end_to_end_on_a_tiny_budget(tmp_path):
    plot = tmp_path / "wan.png"
    # one score per row, after both steps (each score evaluates 128 validation windows in this process: most of
    # the run's time); the target of 10 nats is reached at that first score
    done = subprocess.run([sys.executable, "-m", "geotrain", "bench", "wan", "--cluster", str(DATA / "wan-2x2.yaml"),
                           "--steps", "2", "--eval-every", "2", "--global-batch", "16", "--rows", "2,9",
                           "--target", "10", "--json", "--plot", str(plot), "--run-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["target"] == 10
    # --run-dir: one run directory per row, named by its label, each with a metrics file per rank
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == len(doc["rows"]) and all(sorted(p.name for p in (run / "metrics").iterdir())
                                                  == [f"rank-{r}.jsonl" for r in range(4)] for run in runs)
    baseline, sign, chosen, limit = doc["rows"]  # the limit row always runs, last
    for row in doc["rows"]:
        assert {"label", "time_to_target_s", "speedup", "inter_region_bytes", "val_loss", "limit_fraction",
                "compute_fraction", "peak_inter_region_gbps"} <= set(row)
        assert row["time_to_target_s"] > 0 and np.isfinite(row["val_loss"])  # a target of 10 nats: reached at once
        assert row["limit_fraction"] == pytest.approx(row["time_to_target_s"] / limit["time_to_target_s"])
        assert 0 < row["compute_fraction"] <= 1
    assert "limit" in limit["label"] and limit["limit_fraction"] == pytest.approx(1.0)
    assert baseline["limit_fraction"] > 1  # the same training, links not free
    assert limit["peak_inter_region_gbps"] > baseline["peak_inter_region_gbps"] > 0  # free links: bytes at once
    assert baseline["label"].startswith("DDP baseline") and baseline["speedup"] == pytest.approx(1.0)
    assert baseline["stages"] == 1 and baseline["replicas"] == 4
    assert sign["codecs"]["dp"] == ["sign"] * sign["stages"]
    assert chosen["codecs"] == {key: doc["codec_choice"][key] for key in ("dp", "pp")}
    assert "fp16" in chosen["codecs"]["pp"]  # the slow cut
    for compressed in (sign, chosen):
        assert 0 < compressed["inter_region_bytes"] < baseline["inter_region_bytes"]
    # the planned 2x2 keeps each DP group inside a region: only the cut crosses (fp32 in the sign row),
    # and only the planner's choice compresses it (fp16 activations: half the bytes of the cut)
    assert sign["stages"] == chosen["stages"] == 2
    assert chosen["inter_region_bytes"] < 0.55 * sign["inter_region_bytes"]
    assert plot.stat().st_size > 10_000


def test_compute_clock_is_validated_where_it_is_given():
    from geotrain.emulate import EmulationError, install
    from geotrain.runtime import RuntimeConfig, RuntimeConfigError

    cluster = load_cluster(str(DATA / "wan-2x2.yaml"))
    with pytest.raises(RuntimeConfigError, match="compute_clock must be wall or cpu, got 'gpu'"):
        RuntimeConfig.of(cluster=cluster, assignment=np.array([[0, 2], [1, 3]]), compute_clock="gpu")
    with pytest.raises(EmulationError, match="compute clock must be one of wall, cpu, got 'gpu'"):
        install(cluster, [0, 1], compute_clock="gpu")


def test_local_sgd_rows_are_planned_with_the_dp_term_amortised_over_h_steps():
    cluster = load_cluster(WAN_CLUSTER)
    layouts = planned_layouts(cluster, model_job(32), WanBenchConfig())
    local = [row for row in DEFAULT_ROWS if row.sync_every > 1]
    assert local and all(_row_available(row) is None for row in local)
    assert all(row.sync_every == 1 for row in DEFAULT_ROWS[:10])
    fp32 = min(layouts, key=lambda name: layouts[name].cost_s)
    amortised = min(layouts, key=lambda name: layouts[name].amortised_s(5))
    # every step: the 2x2 pipeline wins; synchronising every 5 steps: pure data parallelism (no cut to pay)
    assert (fp32, amortised) == ("2x2", "1x4")
    for layout in layouts.values():
        assert layout.dp_s + layout.pp_s == pytest.approx(layout.cost_s)
        assert layout.amortised_s(1) == pytest.approx(layout.cost_s)


def test_model_presets_as_jobs_and_unknown_model_names():
    small, tiny = model_job(32, "small"), model_job(32)
    assert small.params == 3_206_656 and tiny.params == 816_896
    with pytest.raises(WanBenchError, match="--model: one of tiny, tiny-2layer, small, got 'huge'"):
        model_job(32, "huge")


def test_bench_cluster_names_resolve_to_the_bench_files_and_wan_4x2_has_two_devices_per_site():
    assert bench_cluster("wan-4x1") == WAN_CLUSTER
    assert bench_cluster("seed-geo") == "seed-geo" and bench_cluster("./wan-4x2") == "./wan-4x2"
    cluster = load_cluster(bench_cluster("wan-4x2"))
    assert cluster.n_devices == 8 and cluster.n_regions == 4
    assert cluster.region_of.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # numbered site by site
    one = load_cluster(WAN_CLUSTER)
    inter = cluster.region_of[:, None] != cluster.region_of[None, :]
    assert np.array_equal(cluster.latency_ms[::2, ::2], one.latency_ms)  # the same sites and links
    intra = ~inter & ~np.eye(8, dtype=bool)
    assert np.all(cluster.bandwidth_gbps[inter] == 0.1) and np.all(cluster.bandwidth_gbps[intra] == 10)
