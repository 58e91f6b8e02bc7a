"""`geotrain demo schedule` (the seed's demo 1) and `geotrain bench plan`: JSON shape and numbers."""

import json

import numpy as np
import pytest

from geotrain.cli.main import main
from geotrain.cluster import seed_geo
from geotrain.demos import ScheduleDemoConfig, region_locality, run_schedule_demo

ROW_KEYS = ["random-mean", "random-best", "pipeline-local", "dp-local", "strict", "sideways", "planner-packed"]


@pytest.fixture(scope="module")
def demo():
    return run_schedule_demo(ScheduleDemoConfig())


def test_demo_rows_are_the_seeds_and_ratios_are_to_the_datacenter(demo):
    assert [row.key for row in demo.rows] == ROW_KEYS
    assert demo.datacenter["total_s"] == pytest.approx(2.43, rel=0.01)
    for row in demo.rows:
        assert row.ratio == pytest.approx(row.total_s / demo.datacenter["total_s"])
    assert demo.row("random-mean").total_s >= demo.row("random-best").total_s


def test_demo_reproduces_the_seeds_shape(demo):
    best = demo.best["total_s"]
    assert demo.row("random-mean").total_s >= 5 * best
    assert demo.row("pipeline-local").total_s < demo.row("dp-local").total_s
    assert min(demo.per_restart_s["strict"]) > 1.5 * min(demo.per_restart_s["sideways"])
    assert demo.row("sideways").total_s <= min(demo.row("pipeline-local").total_s, demo.row("dp-local").total_s) * (1 + 1e-12)
    assert len(demo.per_restart_s["strict"]) == len(demo.per_restart_s["sideways"]) == 5
    assert demo.row("sideways").total_s == min(demo.per_restart_s["sideways"])


def test_demo_best_plan_split_locality_and_compute(demo):
    best = demo.best
    assert best["dp_s"] + best["pp_s"] == pytest.approx(best["total_s"])
    assert demo.locality["best"] == region_locality(seed_geo(), np.array(best["assignment"]))
    assert demo.locality["best"]["pipeline_edges"] == 24 and demo.locality["best"]["dp_groups"] == 4
    assert demo.locality["random_mean_pipeline_edges_in_region"] < 12
    compute = demo.compute
    assert compute["compute_s"] == pytest.approx(10.2, abs=0.05)
    assert compute["slowdown_best"] == pytest.approx((10.2 + best["total_s"]) / (10.2 + 2.43), rel=0.01)
    assert 1 < compute["slowdown_best"] < compute["slowdown_random_mean"]


def test_observations_state_the_measured_numbers(demo):
    assert len(demo.observations) == 5
    text = " ".join(demo.observations)
    assert f"{demo.row('random-mean').total_s:.1f} s" in text
    assert f"{min(demo.per_restart_s['strict']):.1f}-{max(demo.per_restart_s['strict']):.1f} s" in text
    assert "stalls" in demo.observations[2]
    assert f"{demo.compute['slowdown_best']:.1f}x" in demo.observations[3]


def test_packed_activations_let_the_planner_cut_pipelines_across_regions(demo):
    """int4-block on inter-region cuts (0.53 of the job's 2 bytes per value): the planner moves every cut across
    regions and every DP group inside one, and the iteration gets shorter than the seed's best plan."""
    packed, plain = demo.row("planner-packed"), demo.row("sideways")
    assert demo.locality["packed"]["pipeline_edges_in_region"] == 0
    assert demo.locality["packed"]["dp_groups_in_region"] == 4
    assert packed.total_s == pytest.approx(14.6, abs=0.1) and plain.total_s == pytest.approx(19.3, abs=0.1)
    assert packed.dp_s < 1 < plain.dp_s
    assert f"{packed.total_s:.1f} s of communication instead of {plain.total_s:.1f} s" in demo.observations[4]


def test_region_locality_counts():
    cluster = seed_geo()
    in_region = np.array([[8 * (r // 2) + (r % 2) * 4 + s for r in range(8)] for s in range(4)])
    assert region_locality(cluster, in_region) == {"pipeline_edges_in_region": 24, "pipeline_edges": 24,
                                                   "dp_groups_in_region": 0, "dp_groups": 4}
    assert region_locality(cluster, np.arange(32).reshape(4, 8))["dp_groups_in_region"] == 4


def test_demo_schedule_cli_json_and_plot(tmp_path, capsys):
    plot = tmp_path / "best.png"
    assert main(["demo", "schedule", "--json", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    doc = json.loads(out)
    assert set(doc) >= {"rows", "datacenter", "per_restart_s", "best", "locality", "compute", "observations"}
    assert [row["key"] for row in doc["rows"]] == ROW_KEYS
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 20_000


def test_demo_schedule_cli_table(capsys):
    assert main(["demo", "schedule", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "pipeline-local" in out and "per-restart results" in out and "Observations" in out


def test_bench_plan_json(capsys):
    assert main(["bench", "plan", "--json", "--method", "pipeline-local", "--method", "local-search",
                 "--swaps", "20000"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [row["label"] for row in doc["rows"]] == ["pipeline-local", "strict LS 5x3000", "sideways LS 5x20000"]
    assert min(row["gap"] for row in doc["rows"]) == 0.0
    assert all(row["gap"] >= 0 and row["evaluations"] >= 1 for row in doc["rows"])
    speed = doc["swap_speed"]
    assert speed["devices"] == 32 and speed["walks_agree"] is True
    assert set(speed["evals_per_s"]) == {"incremental", "compiled_full", "numpy_full"}
    assert speed["speedup_vs_numpy_full"] == pytest.approx(
        speed["evals_per_s"]["incremental"] / speed["evals_per_s"]["numpy_full"])
