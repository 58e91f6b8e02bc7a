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
