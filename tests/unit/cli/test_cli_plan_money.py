"""`geotrain plan` on a cluster with prices: each plan's money, and --objective cost."""

import json

import pytest

from geotrain.cli.main import main

CLUSTER = """name: geo3-priced
regions:
  - {name: tokyo, devices: 4, gpu: H100}
  - {name: frankfurt, devices: 4, gpu: [A100, A100, T4, T4]}
  - {name: saopaulo, devices: 4, gpu: L4}
links:
  - {between: [tokyo, frankfurt], gbps: 0.5, ms: 230}
  - {between: [tokyo, saopaulo], gbps: 0.2, ms: 260}
  - {between: [frankfurt, saopaulo], gbps: 1.0, ms: 190}
defaults: {intra: {gbps: 100, ms: 0.1}}
prices:
  gpu_hour: {H100: 4.0, A100: 1.8, T4: 0.35, L4: 0.7}
  egress_per_gb: {default: 0.09, saopaulo: 0.15}
"""
JOB = "name: gpt-1b\nparams: 1.0e9\nlayers: 24\nhidden: 2048\nseq_len: 2048\nglobal_batch: 512\n"
HOUR = {"H100": 4.0, "A100": 1.8, "T4": 0.35, "L4": 0.7}
GPUS = ["H100"] * 4 + ["A100", "A100", "T4", "T4"] + ["L4"] * 4


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("priced")
    (root / "c.yaml").write_text(CLUSTER)
    (root / "job.yaml").write_text(JOB)
    return str(root / "c.yaml"), str(root / "job.yaml")


def test_a_fixed_layout_prices_its_step_and_the_egress_of_its_outer_sync(files, capsys):
    cluster, job = files
    assert main(["plan", "--cluster", cluster, "--job", job, "--stages", "2", "--replicas", "3", "--wan-recipe",
                 "auto", "--recipe-steps", "1000", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    money, step = plan["money"], plan["wan_recipe"]["step_s"]
    used = {d for row in plan["assignment"] for d in row}
    assert money["gpu_usd_per_step"] == pytest.approx(sum(HOUR[GPUS[d]] for d in used) * step / 3600)
    regions = {d // 4 for d in used}
    assert (money["egress_usd_per_step"] > 0) == (len(regions) > 1)  # the outer sync crosses sites, or nothing does
    assert money["usd_per_run"] == pytest.approx(1000 * money["usd_per_step"])
    assert plan["explanation"][-1].startswith("Money: $")


def test_objective_cost_ranks_layouts_by_money_for_the_same_progress(files, capsys):
    cluster, job = files
    assert main(["plan", "--cluster", cluster, "--job", job, "--wan-recipe", "auto", "--objective", "cost",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    usd = [row["money"]["usd_per_step"] * row["recipe"]["charged_s"] / row["recipe"]["step_s"]
           for row in plan["candidates"]]
    assert usd == sorted(usd) and plan["objective"] == "cost"
    assert main(["plan", "--cluster", cluster, "--job", job, "--wan-recipe", "auto", "--json"]) == 0
    by_time = json.loads(capsys.readouterr().out)
    seconds = [row["recipe"]["charged_s"] for row in by_time["candidates"]]
    assert seconds == sorted(seconds) and by_time["objective"] == "time"


def test_objective_cost_needs_prices_and_an_auto_configured_layout(files, capsys, tmp_path):
    cluster, job = files
    assert main(["plan", "--cluster", cluster, "--job", job, "--stages", "1", "--replicas", "2",
                 "--objective", "cost"]) == 2
    assert "give neither --stages nor --replicas" in capsys.readouterr().err
    unpriced = tmp_path / "unpriced.yaml"
    unpriced.write_text(CLUSTER.split("prices:")[0])
    assert main(["plan", "--cluster", str(unpriced), "--job", job, "--objective", "cost"]) == 2
    assert "has no prices" in capsys.readouterr().err
