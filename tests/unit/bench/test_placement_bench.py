"""The placement benchmarks: seeds against the proven optimum, and the scale table with its bound."""

import json

import numpy as np
import pytest

from geotrain.bench.placement import SeededRun, SeedsBenchConfig, run_seeds_bench
from geotrain.cli.main import main


def test_seeds_bench_measures_gaps_to_the_exact_optimum_on_seed_geo():
    config = SeedsBenchConfig(seeds=(0, 1), runs=(
        SeededRun("pipeline-local", "pipeline-local", seeded=False),
        SeededRun("dp-local", "dp-local", seeded=False),
        SeededRun("hierarchical", "hierarchical", {"starts": 2, "rounds": 2})))
    bench = run_seeds_bench(config)
    assert bench.reference["kind"] == "optimum"
    assert bench.reference["total_s"] == pytest.approx(19.2915, abs=1e-3)
    gaps = {row["label"]: [r["gap"] for r in row["runs"]] for row in bench.rows}
    assert gaps["pipeline-local"] == [pytest.approx(0.0, abs=1e-12)]
    assert gaps["dp-local"][0] > 0.5
    assert len(gaps["hierarchical"]) == 2 and all(0 <= g <= 0.01 for g in gaps["hierarchical"])


def test_bench_scale_cli_reports_bound_and_gap_per_method(capsys):
    assert main(["bench", "scale", "--sizes", "64", "--method", "pipeline-local", "--method", "exact",
                 "--jitter", "0", "--time-limit", "10", "--bound-time-limit", "10", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {row["method"]: row for row in doc["rows"]}
    assert set(rows) == {"pipeline-local", "exact"}
    bound = rows["exact"]["lower_bound_s"]
    assert rows["exact"]["total_s"] == pytest.approx(bound, rel=1e-6)  # region-uniform: bound = optimum
    assert rows["pipeline-local"]["total_s"] >= bound * (1 - 1e-9)
    assert all(row["devices"] == 64 and row["stages"] == 8 and row["replicas"] == 8 for row in doc["rows"])


def test_uneven_region_clusters_are_seeded_unequal_and_region_uniform():
    from geotrain.bench.scale import uneven_regions

    for n in (32, 64, 128):
        cluster = uneven_regions(n, seed=0)
        sizes = cluster.region_sizes()
        assert cluster.n_devices == n and 4 <= cluster.n_regions <= 8
        assert sizes.min() >= 2 and sizes.max() > sizes.min()
        assert cluster.is_region_uniform()
        intra = [cluster.region_link(g, g).gbps for g in range(cluster.n_regions)]
        assert len(set(intra)) == cluster.n_regions  # unequal intra-region speeds
        again = uneven_regions(n, seed=0)
        assert np.array_equal(again.bandwidth_gbps, cluster.bandwidth_gbps)


@pytest.mark.slow
def test_bench_scale_uneven_family_reports_rows(capsys):
    assert main(["bench", "scale", "--family", "uneven", "--sizes", "32", "--method", "pipeline-local",
                 "--time-limit", "5", "--bound-time-limit", "5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["rows"]
    assert row["cluster"] == "uneven-32-seed0" and row["stages"] == 8 and row["replicas"] == 4
    assert row["total_s"] >= row["lower_bound_s"] * (1 - 1e-9)
