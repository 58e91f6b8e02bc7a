"""`bench scale`: the cluster families (issue 21's six uneven regions among them) and the rows' wall
time against their limit."""

import json

import numpy as np
import pytest

from geotrain.bench.scale import ScaleBenchConfig, bench_cluster, uneven_six_regions
from geotrain.cli.main import main
from geotrain.cluster import load_cluster
from geotrain.search import SearchError
from geotrain.search.watchdog import GRACE_S

pytestmark = pytest.mark.serial  # measures wall time or bandwidth: runs alone (Makefile)


def test_six_uneven_regions_match_the_issue_case_and_the_example_file():
    cluster = uneven_six_regions(64, seed=0)
    assert cluster.region_sizes().tolist() == [16, 12, 12, 8, 8, 8] and cluster.is_region_uniform()
    inter = [cluster.region_link(a, b) for a in range(6) for b in range(a + 1, 6)]
    assert len({link.gbps for link in inter}) == 15 and all(0.3 <= link.gbps <= 1.3 for link in inter)
    assert all(10.0 <= link.ms <= 250.0 for link in inter)
    assert all(cluster.region_link(g, g).gbps == 10.0 for g in range(6))
    example = load_cluster("examples/clusters/uneven6-64.yaml")
    assert np.array_equal(example.bandwidth_gbps, cluster.bandwidth_gbps)
    assert np.array_equal(example.latency_ms, cluster.latency_ms)
    assert uneven_six_regions(256, seed=0).region_sizes().tolist() == [64, 48, 48, 32, 32, 32]
    with pytest.raises(SearchError, match="multiple of 64"):
        uneven_six_regions(96)


def test_families_build_their_clusters():
    sizes = {family: bench_cluster(ScaleBenchConfig(sizes=(128,), family=family), 128)
             for family in ("uniform", "jittered", "uneven", "many-region")}
    assert sizes["uniform"].is_region_uniform() and not sizes["jittered"].is_region_uniform()
    assert sizes["many-region"].n_regions == 6 and all(c.n_devices == 128 for c in sizes.values())


def test_bench_scale_rows_report_wall_time_within_the_limit(capsys):
    assert main(["bench", "scale", "--family", "many-region", "--sizes", "64", "--method", "pipeline-local",
                 "--method", "hierarchical", "--time-limit", "3", "--bound-time-limit", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {row["method"] for row in doc["rows"]} == {"pipeline-local", "hierarchical"}
    for row in doc["rows"]:
        assert row["cluster"] == "uneven6-64-seed0" and row["limit_s"] == 7.0
        assert 0.0 < row["wall_s"] <= row["limit_s"] * 1.1 + GRACE_S  # the bound's child may use its grace
        assert row["total_s"] >= row["lower_bound_s"] * (1 - 1e-9) > 0.0


def test_bench_scale_with_the_bound_beside_runs_auto_and_its_bound_within_one_limit(capsys):
    assert main(["bench", "scale", "--family", "many-region", "--sizes", "64", "--bound", "beside",
                 "--time-limit", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["rows"]
    assert row["method"] == "auto" and doc["config"]["bound"] == "beside" and row["limit_s"] == 4.0
    assert 0.0 < row["wall_s"] <= 4.0 * 1.1 + GRACE_S
    assert row["total_s"] >= row["lower_bound_s"] * (1 - 1e-9) > 0.0 and row["gap"] >= 0.0


def test_bench_scale_refuses_the_bound_beside_a_method_that_reports_its_plan_only_at_the_end(capsys):
    assert main(["bench", "scale", "--sizes", "64", "--bound", "beside", "--method", "genetic"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("geotrain: error: bench scale: --bound beside runs one method that reports its plans while "
                   "it searches (auto), got genetic")
