"""`geotrain plan --wan-recipe auto` records the recipe in the plan; `geotrain train --plan` runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from geotrain.bench.wan import bench_cluster

GEOTRAIN = (sys.executable, "-m", "geotrain")


@pytest.mark.slow  # two CLI launches
@pytest.mark.timeout(200)
def test_plan_writes_the_wan_recipe_and_train_takes_its_settings(tmp_path: Path):
    out = tmp_path / "plan.json"
    cluster = bench_cluster("wan-4x1")
    done = subprocess.run([*GEOTRAIN, "plan", "--cluster", cluster, "--stages", "1", "--replicas", "4",
                           "--wan-recipe", "auto", "--compute-s", "0.125", "--recipe-steps", "60",
                           "--recipe-max-delay", "0", "--json", "--out", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    recipe = json.loads(done.stdout)["wan_recipe"]
    assert recipe["version"] == 1 and recipe["compute_s"] == 0.125
    assert (recipe["sync_every"], recipe["delay"], recipe["outer_lr"], recipe["outer_momentum"]) == (5, 0, 1.0, 0.0)
    assert recipe["step_s"] == pytest.approx(0.125 + recipe["sync_s"] * recipe["fragments"] / 5)
    shown = subprocess.run([*GEOTRAIN, "train", "--cluster", cluster, "--plan", str(out), "--print-config"],
                           capture_output=True, text=True, timeout=180)
    assert shown.returncode == 0, shown.stderr
    settings = dict(line.split(" = ", 1) for line in shown.stdout.splitlines() if " = " in line)
    assert settings["sync_every"] == "5" and settings["sync_delay"] == "0"
    assert settings["fragments"] == str(recipe["fragments"])
    assert settings["dp_codecs"] == f'["{recipe["codec"]}"]'


@pytest.mark.slow  # two CLI launches
@pytest.mark.timeout(200)
def test_plan_prices_moment_sync_and_the_codecs_cpu_and_train_runs_them(tmp_path: Path):
    out = tmp_path / "plan.json"
    cluster = bench_cluster("wan-4x1")
    base = [*GEOTRAIN, "plan", "--cluster", cluster, "--stages", "1", "--replicas", "4", "--wan-recipe", "auto",
            "--compute-s", "0.125", "--recipe-steps", "60", "--recipe-max-delay", "0", "--json"]
    done = subprocess.run([*base, "--recipe-sync-moments", "--recipe-measure-codecs", "--out", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    recipe = json.loads(done.stdout)["wan_recipe"]
    assert recipe["sync_moments"] is True and recipe["moment_syncs"] == 1 and recipe["delay"] == 0
    # blocking syncs: the link time, plus the codecs' CPU (measured; for the default job's 1.3e9 values it is
    # seconds per sync on this machine's CPU: what a planner should see before choosing host-side codecs)
    extra = recipe["step_s"] - (0.125 + recipe["sync_s"] * recipe["fragments"] / recipe["sync_every"])
    assert extra > 0
    shown = subprocess.run([*GEOTRAIN, "train", "--cluster", cluster, "--plan", str(out), "--print-config"],
                           capture_output=True, text=True, timeout=180)
    assert shown.returncode == 0, shown.stderr
    settings = dict(line.split(" = ", 1) for line in shown.stdout.splitlines() if " = " in line)
    assert settings["sync_moments"] == "true" and settings["sync_every"] == str(recipe["sync_every"])
    assert settings["moment_syncs"] == "1"


MIXED = Path(__file__).resolve().parents[3] / "examples" / "clusters" / "mixed-gpus-3x2.yaml"


@pytest.mark.slow  # three CLI launches
@pytest.mark.timeout(300)
@pytest.mark.parametrize("compute_s, chosen", [(2.0, "batch_shares"), (0.1, "wan_recipe")])
def test_plan_on_mixed_gpus_chooses_speed_shares_or_the_recipe_by_cost_and_train_runs_it(tmp_path: Path, compute_s,
                                                                                          chosen):
    job = tmp_path / "job.yaml"
    job.write_text("name: tiny-24\nparams: 816896\nlayers: 4\nhidden: 128\nseq_len: 96\nglobal_batch: 24\n"
                   "bytes_per_value: 4\nvocab: 44\n")
    out = tmp_path / "plan.json"
    done = subprocess.run([*GEOTRAIN, "plan", "--cluster", str(MIXED), "--job", str(job), "--stages", "1",
                           "--replicas", "3", "--exclude-devices", "oregon-1,virginia-1,frankfurt-1", "--wan-recipe",
                           "auto", "--compute-s", str(compute_s), "--recipe-steps", "60", "--json", "--out", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    site = plan["site_compute"]
    assert site["chosen"] == chosen and site["step_s"] == min(site["candidates_step_s"]["batch_shares"],
                                                              site["candidates_step_s"]["wan_recipe"])
    assert set(site["site_compute_fraction"]) == {"oregon-0", "virginia-0", "frankfurt-0"}
    assert (chosen in plan) and ({"batch_shares", "wan_recipe"} - {chosen}).isdisjoint(plan)
    shown = subprocess.run([*GEOTRAIN, "train", "--cluster", str(MIXED), "--plan", str(out), "--print-config"],
                           capture_output=True, text=True, timeout=180)
    assert shown.returncode == 0, shown.stderr
    settings = dict(line.split(" = ", 1) for line in shown.stdout.splitlines() if " = " in line)
    if chosen == "batch_shares":
        assert plan["batch_shares"]["samples"] == [15, 6, 3]
        assert settings["batch_shares"] == '"speed"' and "sync_every" not in settings  # per-step DP
    else:
        assert settings["batch_shares"] == '"equal"' and settings["sync_every"] == str(plan["wan_recipe"]["sync_every"])
